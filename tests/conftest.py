"""Project-wide test settings."""

from __future__ import annotations

import inspect
import os
import sys

import torch

# Tiny matmuls gain nothing from threads, and on a busy 2-core machine torch's thread pool
# spin-waits: each op became ~100-1000x slower (measured 252 ms vs 1.6 ms per tiny forward).
torch.set_num_threads(1)
# The same for the processes tests start (CLI commands, the GPU scripts' CPU runs, servers, gloo ranks):
# two test workers each running a two-thread subprocess oversubscribe the cores in the same way.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
# Without a GPU the Triton kernels run in its interpreter, which must be switched on before anything
# (transformers, the dflash package, dllm.kernels) imports triton; tests/kernels/conftest.py relies on it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The slow suite's longest tests (20-50 s each on two busy cores: `python -m pytest -q -m slow -n 2
# --durations=40`) are handed out first. pytest-xdist hands tests out in collection order, so a long
# test collected last (tests/train/ comes last) runs while the other worker has nothing left to do.
LONGEST_FIRST = (
    "tests/test_gpu_scripts.py",
    "tests/models/parallel/test_tensor_parallel.py",
    "tests/cli/test_serve_tensor_parallel.py",
    "tests/train/test_learn2pd.py",
    "tests/models/parallel/test_objects.py",
    "tests/test_docs.py::test_example_runs[docs/guides/evaluation.md",
)


def pytest_collection_modifyitems(config, items):
    """Stable reorder: the tests under ``LONGEST_FIRST`` first (only the order changes, never which run)."""
    items.sort(key=lambda item: not item.nodeid.startswith(LONGEST_FIRST))


def pytest_runtest_setup(item):
    """Once triton's interpreter is imported (by a test module, under ``TRITON_INTERPRET=1``), make its
    device-function calls cheaper (``_one_patch_per_launch``)."""
    if not _INTERPRETER_SPED_UP and "triton.runtime.interpreter" in sys.modules:
        _one_patch_per_launch(sys.modules["triton.runtime.interpreter"])


_INTERPRETER_SPED_UP = False


def _one_patch_per_launch(ti) -> None:
    """Triton's interpreter re-patches ``triton.language`` (``inspect.getmembers`` over its modules) at
    EVERY call of a ``@triton.jit`` device function, ``tl.max`` / ``tl.sum`` / ``tl.argmax`` included:
    about two thirds of an interpreted kernel's time in our kernels (a LoPA kernel test: 7.2 s -> 2.3 s).
    Within one launch the first call's patch holds until the launch's end (only the launch's own patch
    is ever restored, after its grid), so the later calls of a launch with the same globals skip it: the
    same semantics, cheaper. Applied only where the interpreter's code is the shape this replicates;
    otherwise the tests run unchanged, slower."""
    global _INTERPRETER_SPED_UP
    _INTERPRETER_SPED_UP = True
    try:
        device_src = inspect.getsource(ti.InterpretedFunction.__call__)
        launch_src = inspect.getsource(ti.GridExecutor.__call__)
    except (AttributeError, OSError, TypeError):
        return
    if ("_patch_lang(self.fn)" not in device_src or "self.rewrite()" not in device_src
            or "patch_scope.restore()" not in launch_src or not hasattr(ti, "InterpreterError")):
        return
    patched: set[int] = set()  # ids of the device functions' globals patched in the current launch
    launch = ti.GridExecutor.__call__

    def one_launch(self, *args, **kwargs):
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.clear()

    def device_call(self, *args, **kwargs):
        if id(self.fn.__globals__) not in patched:
            ti._patch_lang(self.fn)
            patched.add(id(self.fn.__globals__))
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise ti.InterpreterError(repr(e)) from e

    ti.GridExecutor.__call__ = one_launch
    ti.InterpretedFunction.__call__ = device_call

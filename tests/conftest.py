"""Project-wide test settings."""

from __future__ import annotations

import os

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

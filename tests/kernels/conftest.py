"""Kernel tests: the Triton kernels against their plain-PyTorch neighbours (``dllm.kernels.reference``).

Without a CUDA device the kernels run in the Triton interpreter, which must be switched on BEFORE
any ``@triton.jit`` decorator executes: this file sets ``TRITON_INTERPRET=1`` before anything
imports triton or ``dllm.kernels.triton_*``. With a CUDA device the environment is left alone, so
the same tests run the compiled kernels on the GPU (``TRITON_INTERPRET=1`` in the shell forces the
interpreter there too). The whole folder is skipped, with the reason, when triton is missing.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install triton): kernel tests skipped", allow_module_level=True)

if not torch.cuda.is_available():
    if "dllm.kernels.triton.attention" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("dllm.kernels.triton.attention was imported without TRITON_INTERPRET=1 and there is "
                    "no GPU; run the kernel tests in their own session", allow_module_level=True)
    os.environ["TRITON_INTERPRET"] = "1"

from dllm.kernels.triton.attention import _attn_fwd_kernel, _interpreted, unavailable_reason  # noqa: E402

if unavailable_reason() is not None:
    pytest.skip(f"the Triton kernels cannot run here: {unavailable_reason()}", allow_module_level=True)

INTERPRETED = _interpreted(_attn_fwd_kernel)
DEVICE = torch.device("cpu" if INTERPRETED else "cuda")


@pytest.fixture
def device() -> torch.device:
    return DEVICE

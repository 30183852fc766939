"""The kernels compiled ahead of time for NVIDIA targets (``dllm.kernels.triton.ahead``): launches recorded
instead of run, the occupancy arithmetic, and every kernel compiled for sm_90 by
``benchmarks/compile_kernels.py`` in a process without the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dllm.kernels.triton import ahead
from dllm.kernels.triton.launch import record_launches, recording
from dllm.kernels.triton.stats import stats_buffers, vocab_stats

ROOT = Path(__file__).resolve().parents[2]


def test_recorded_launches_run_nothing():
    logits = torch.randn(2, 3, 50)
    out = tuple(t.fill_(7) for t in stats_buffers((2, 3), logits.device))
    with record_launches(132) as rec:
        assert recording() is rec
        vocab_stats(logits, banned=1, out=out)
        vocab_stats(logits.to(torch.bfloat16), banned=1)  # the interpreter's dtype check is for a run
    assert recording() is None
    assert [launch.name for launch in rec.launches] == ["vocab_stats", "vocab_stats"]
    assert rec.launches[0].grid == (6,) and rec.launches[0].kwargs["NOISE"] == 0
    assert bool((out[0] == 7).all()) and bool((out[1] == 7).all())  # nothing ran
    vocab_stats(logits, banned=1, out=out)  # outside the block the kernel runs again
    assert torch.equal(out[0][..., 0], logits.masked_fill(torch.arange(50) == 1, float("-inf")).argmax(-1))


def test_record_launches_needs_sms():
    with pytest.raises(ValueError, match="sms must be >= 1, got 0"):
        with record_launches(0):
            pass


def test_occupancy_from_the_targets_limits():
    h100 = ahead.TARGETS["sm90"]
    assert ahead.occupancy(h100, 255, 28 * 1024, 4) == (2, "registers")  # 64 Ki registers / (4 x 8,192)
    assert ahead.occupancy(h100, 24, 0, 4) == (16, "threads")  # 2,048 threads / 128 (registers: 21)
    assert ahead.occupancy(h100, 16, 0, 1) == (32, "blocks")
    assert ahead.occupancy(h100, 32, 100 * 1024, 4) == (2, "shared")  # 228 KiB / (100 + 1) KiB
    assert ahead.occupancy(h100, 32, 240 * 1024, 4) == (0, "shared")  # more than a block may have
    assert ahead.occupancy(ahead.TARGETS["sm80"], 32, 200 * 1024, 4) == (0, "shared")  # fits an H100, not an A100
    assert ahead.occupancy(h100, 32, 0, 64) == (0, "threads")  # 2,048 threads in one block


def test_the_interpreter_compiles_nothing():
    assert "TRITON_INTERPRET" in (ahead.unavailable_reason() or "")  # tests/conftest.py sets it


def _compiling_env() -> dict:
    """The environment of a process that compiles (no interpreter); skips the test when it cannot."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    check = subprocess.run([sys.executable, "-c", "from dllm.kernels.triton import ahead; print(ahead.unavailable_reason())"],
                           env=env, cwd=ROOT, capture_output=True, text=True)
    if check.stdout.strip() != "None":
        pytest.skip(f"no NVIDIA compiler here: {check.stdout.strip() or check.stderr[-300:]}")
    return env


def test_every_kernel_compiles_and_launches_on_sm90(tmp_path):
    env = _compiling_env()
    out = tmp_path / "compile.txt"
    run = subprocess.run([sys.executable, "benchmarks/compile_kernels.py", "--targets", "sm90", "--out", str(out)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    kernels, tiles = out.read_text().split("\n## ")[1:]  # every kernel on sm_90; the attention kernel's tiles
    table = [[cell.strip("| ") for cell in line.split(" | ")] for line in kernels.splitlines() if line.startswith("| ")]
    header, body = table[0], table[1:]
    assert len([line for line in tiles.splitlines() if line.startswith("| ")]) == 1 + 18  # a header, 3 x 3 tiles x 2 warps
    names = {row[0] for row in body}
    assert names == {"vocab_stats", "flash_attention", "merge_splits", "rms_norm", "rope_rows", "lopa_propose",
                     "lopa_select"}
    local, blocks = header.index("local B"), header.index("blocks / SM")
    for row in body:
        assert row[local] == "0", row  # no spills
        assert not row[blocks].startswith("CANNOT"), row


def test_a_launch_with_arguments_the_kernel_lacks_is_refused():
    env = _compiling_env()
    code = ("from dllm.kernels.triton import ahead\n"
            "from dllm.kernels.triton.launch import Launch\n"
            "from dllm.kernels.triton.lopa import _lopa_propose_kernel as k\n"
            "try:\n    ahead.specialize(Launch('x', k, (1,), (), {'NOT_A_PARAM': 1}), ahead.TARGETS['sm90'])\n"
            "except (KeyError, TypeError) as e:\n    print(type(e).__name__, e)\n")
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert "NOT_A_PARAM" in run.stdout or "missing" in run.stdout, (run.stdout, run.stderr[-1000:])

"""Every benchmarks/gpu-*.sh runs end to end on a CPU (DEVICE=cpu: the same steps on tiny shapes), so
none can rot before the next GPU session: a step that fails makes its script exit non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("gpu-*.sh"))
# what the device machine's run brings back from $OUT; a script writing more loses the rest silently (a
# CPU run skips the CUDA-only steps: gpu-speed.sh's graphs run writes 2 files more on CUDA, 8 in all)
MAX_FILES = 8


def test_every_gpu_script_is_covered():
    assert {"gpu-check.sh", "gpu-serve.sh", "gpu-speed.sh", "gpu-step.sh"} <= set(SCRIPTS)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_gpu_script_runs_on_cpu(script, tmp_path):
    env = dict(os.environ, DEVICE="cpu", OUT=str(tmp_path / "out"), N="8", REPEATS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this venv's python3 and dllm
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    log = (tmp_path / "out" / "gpu.txt").read_text() if (tmp_path / "out" / "gpu.txt").exists() else ""
    assert run.returncode == 0, f"{script} failed:\n{log}\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
    assert "FAILED" not in log
    files = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert len(files) <= MAX_FILES, f"{script} wrote {len(files)} files; the device brings back {MAX_FILES}: {files}"

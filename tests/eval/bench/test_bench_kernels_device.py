"""``dllm bench kernels --device cuda`` on a machine without CUDA: refused before anything runs."""

import pytest
import torch

from dllm.eval.bench.kernels import run_kernel_bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_refused_before_anything_runs(capsys, monkeypatch):
    from dllm.eval.bench import kernels as K

    monkeypatch.setattr(K, "default_shapes", lambda device: pytest.fail("shapes were built"))
    with pytest.raises(ValueError, match=r"device 'cuda': CUDA is not available \(.*\); available devices: cpu"):
        run_kernel_bench(device="cuda", repeats=1, warmup=0)
    from dllm.cli import main

    assert main(["bench", "kernels", "--device", "cuda"]) == 2  # one line on stderr, no traceback
    err = capsys.readouterr().err
    assert "device 'cuda': CUDA is not available" in err and "Traceback" not in err

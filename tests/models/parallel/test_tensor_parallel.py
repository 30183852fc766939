"""Tensor / expert parallelism (``dllm.load(..., tensor_parallel=N)``, ``dllm.models.parallel``).

Fast: bad splits refused with the numbers before any weight is read; the per-tensor slicing rules;
a one-rank group (gloo, world size 1) equal to the plain model. Slow: 2 and 4 gloo ranks under
torchrun (``benchmarks/tensor_parallel.py``): every family's greedy tokens equal one process's with
three samplers and every cache it takes, ragged, ranks agreeing, parameters per rank <= 0.6x at 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dllm
from dllm.models import loading
from dllm.models.core.config import TransformerConfig
from dllm.models.core.layer.moe import MoEConfig
from dllm.models.parallel.group import free_port
from dllm.models.parallel.plan import ParallelPlan, check_plan
from dllm.models.parallel.shard import TensorParallel, splits_vocab

ROOT = Path(__file__).resolve().parents[3]
CFG = TransformerConfig(vocab_size=64, d_model=48, n_layers=1, n_heads=6, n_kv_heads=2, mlp_hidden=96)


@pytest.mark.parametrize("n, kwargs, match", [
    (4, {}, "attention heads 6 is not divisible by tensor_parallel=4; key/value heads 2 is not divisible"),
    (3, {}, "key/value heads 2 is not divisible by tensor_parallel=3"),
    (2, {"device_map": "auto"}, "cannot be combined with device_map='auto'"),
    (2, {"quantization": "int8"}, "quantization='int8' is not supported"),
    (2, {"expert_parallel": True}, "needs a mixture-of-experts model"),
    (2, {"moe": MoEConfig(n_experts=3, top_k=2, expert_hidden=32), "expert_parallel": True},
     "experts 3 are not divisible by the 2 ranks"),
    (2, {"moe": MoEConfig(n_experts=4, top_k=2, expert_hidden=33)}, "expert width .* 33 is not divisible"),
])
def test_a_split_that_cannot_be_made_is_refused_with_the_numbers(n, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_plan(CFG, n, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"tensor_parallel": 0}, "tensor_parallel must be an integer >= 1"),
    ({"tensor_parallel": "2"}, "tensor_parallel must be an integer >= 1"),
    ({"expert_parallel": True}, "expert_parallel=True needs tensor_parallel=N"),
    ({"tensor_parallel": 3}, "attention heads 4 is not divisible by tensor_parallel=3"),
    ({"tensor_parallel": 2, "device_map": "auto"}, "cannot be combined with device_map"),
    ({"tensor_parallel": 2}, r"needs one process per rank: run the script under `torchrun --nproc-per-node 2"),
])
def test_load_refuses_before_reading_any_weight(monkeypatch, kwargs, match):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(loading, "open_checkpoint", lambda *a, **k: pytest.fail("weights were read"))
    with pytest.raises(ValueError, match=match):
        dllm.load("tiny-random-llada", **kwargs)
    with pytest.raises(ValueError, match="no weights to split"):
        dllm.load("oracle", tensor_parallel=2)


@pytest.mark.parametrize("kwargs, match", [
    ({"tensor_parallel": 4}, "cannot split this target: num_key_value_heads 2 is not divisible by tensor_parallel=4"),
    ({"tensor_parallel": 2, "quantization": "int8"}, "tensor_parallel=2 with quantization='int8' is not supported"),
    ({"tensor_parallel": 0}, "tensor_parallel must be an integer >= 1"),
    ({"tensor_parallel": 2}, "needs one process per rank"),
])
def test_load_target_refuses_a_split_it_cannot_make(monkeypatch, kwargs, match):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=match):
        dllm.load_target("tiny-ar", **kwargs)


def test_each_rank_keeps_its_heads_columns_and_experts():
    moe = MoEConfig(n_experts=4, top_k=2, expert_hidden=8, n_shared=1, n_group=2, topk_group=1)
    w = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    tp = TensorParallel(ParallelPlan(2, 1), None, moe)
    assert torch.equal(tp.local("layers.0.attn.q_proj.weight", w), w[4:])  # rows of rank 1's heads
    assert torch.equal(tp.local("layers.0.attn.v_proj.bias", w[:, 0]), w[4:, 0])
    assert torch.equal(tp.local("layers.3.attn.o_proj.weight", w), w[:, 3:])  # its heads' input columns
    assert torch.equal(tp.local("layers.0.mlp.up_proj.weight", w), w[4:])
    assert torch.equal(tp.local("layers.0.mlp.down_proj.weight", w), w[:, 3:])
    assert torch.equal(tp.local("layers.1.mlp.experts.0.gate_proj.weight", w), w[4:])  # split experts
    assert tp.local("layers.0.attn_norm.weight", w[0]) is not None and tp.local("embed.weight", w) is w
    assert tp.local("lm_head.weight", w) is w  # replicated unless split_vocab
    vocab = TensorParallel(ParallelPlan(2, 1), None, moe, split_vocab=True)
    assert torch.equal(vocab.local("lm_head.weight", w), w[4:]) and torch.equal(vocab.local("embed.weight", w), w[4:])
    ep = TensorParallel(ParallelPlan(2, 1, expert_parallel=True), None, moe)
    assert ep.local("layers.1.mlp.experts.1.down_proj.weight", w) is None  # rank 0's expert
    assert ep.local("layers.1.mlp.experts.2.down_proj.weight", w) is w  # its own, whole
    assert ep.local("layers.1.mlp.shared_experts.up_proj.weight", w) is w  # replicated
    assert ep.local("layers.1.mlp.gate.weight", w) is w  # the router on every rank




@pytest.fixture
def one_rank_group(monkeypatch):
    import torch.distributed as dist

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_the_vocabulary_is_split_when_untied_and_divisible():
    assert splits_vocab(CFG, 2) and splits_vocab(CFG, 4) and not splits_vocab(CFG, 5)  # vocab 64
    assert not splits_vocab(dataclasses.replace(CFG, tie_embeddings=True), 2)  # a tied head reads the rows
    assert not splits_vocab(CFG, 1)


def test_one_rank_is_the_plain_model(one_rank_group):
    """tensor_parallel=1 runs the whole split path (slicing, local modules, all-reduces over one rank)."""
    plain = dllm.load("tiny-random-dream", dtype="float32")
    split = dllm.load("tiny-random-dream", dtype="float32", tensor_parallel=1)
    assert type(split.transformer.layers[0].attn.o_proj).__name__ == "RowParallelLinear"
    prompts = [[20, 21, 22, 23], [30, 31]]
    with pytest.raises(ValueError, match="cuda_graphs=True on a model split over ranks"):
        dllm.generate(split, prompts, cuda_graphs=True, gen_length=4)
    static = dllm.generate(split, prompts, "threshold", gen_length=8, block_length=4, cache="dual", cuda_graphs="static")
    want = dllm.generate(plain, prompts, "threshold", gen_length=8, block_length=4, cache="dual")
    assert torch.equal(static.generated, want.generated)
    for cache in ("none", "dual"):
        want = dllm.generate(plain, prompts, "threshold", gen_length=8, block_length=4, steps=4, cache=cache)
        got = dllm.generate(split, prompts, "threshold", gen_length=8, block_length=4, steps=4, cache=cache)
        assert torch.equal(got.generated, want.generated)


def torchrun(n: int, tmp_path: Path) -> dict:
    out = tmp_path / f"tp{n}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}",
                           f"--master-port={free_port()}", str(ROOT / "benchmarks" / "tensor_parallel.py"),
                           "--models", str(tmp_path / "models"), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_every_family_split_over_gloo_ranks_decodes_as_one_process(n, tmp_path):
    results = torchrun(n, tmp_path)["results"]
    names = ["llada", "dream", "sdar", "fastdllm_v2", "llada2", "llada2:ep", "target tiny-ar"]
    assert [r["model"] for r in results] == names[:6] + (names[6:] if n == 2 else [])
    if n == 2:  # speculative_generate on a target split by transformers' plan (tiny-ar: 2 KV heads)
        target = results.pop()
        assert [run["sampler"] for run in target["runs"]] == ["ngram", "dflash:model=tiny-ar-dflash"]
        assert all(run["equal"] and run["ranks_agree"] for run in target["runs"]), target
    for r in results:
        caches = {run["cache"] for run in r["runs"]}
        assert caches == ({"none", "dual"} if r["model"] in ("llada", "dream") else {"none", "block"}), r
        assert len(r["runs"]) == 8 and all(run["equal"] and run["ranks_agree"] for run in r["runs"]), r
        assert r["logits_max_abs_diff"] < 1e-4, r
        assert r["kv_heads_rank"] == 4 // n  # each rank's caches hold its heads only
        if n == 2:
            assert r["param_bytes_rank"] <= 0.6 * r["param_bytes_whole"], r

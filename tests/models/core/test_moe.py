"""dllm.models.core.layer.moe: LLaDA 2.x routing (group-limited top-k, normalised + scaled weights), the
expert-batched forward against the per-token reference, and the experts-per-forward count."""

from __future__ import annotations

import pytest
import torch

from dllm.models.core.layer.moe import MoEConfig, SparseMoE, count_experts, group_limited_topk, moe_reference, route

CFG = MoEConfig(n_experts=16, top_k=4, expert_hidden=24, n_shared=1, n_group=4, topk_group=2, routed_scaling=2.5)


def make_moe(cfg: MoEConfig = CFG, d: int = 32, seed: int = 0, dtype: torch.dtype = torch.float32) -> SparseMoE:
    g = torch.Generator().manual_seed(seed)
    moe = SparseMoE(d, cfg, layer=1)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        moe.gate.expert_bias.copy_(torch.randn(cfg.n_experts, generator=g) * 0.1)
    return moe.to(dtype)


def test_routing_stays_inside_the_best_groups() -> None:
    torch.manual_seed(0)
    scores = torch.rand(50, 16)
    idx = group_limited_topk(scores, n_group=4, topk_group=2, top_k=4)
    best_groups = scores.view(50, 4, 4).topk(2, dim=-1)[0].sum(-1).topk(2, dim=-1)[1]  # [N, 2]
    for n in range(50):
        assert set((idx[n] // 4).tolist()) <= set(best_groups[n].tolist())
        allowed = [e for e in range(16) if e // 4 in best_groups[n].tolist()]
        want = sorted(allowed, key=lambda e: -scores[n, e].item())[:4]
        assert idx[n].tolist() == want


def test_weights_are_unbiased_scores_normalised_and_scaled() -> None:
    torch.manual_seed(1)
    logits = torch.randn(7, 16)
    bias = torch.zeros(16)
    bias[3] = 10.0  # expert 3 always chosen, but its weight comes from its own score
    idx, w = route(logits, bias, CFG)
    assert (idx == 3).any(dim=1).all()
    scores = torch.sigmoid(logits).gather(1, idx)
    torch.testing.assert_close(w, 2.5 * scores / scores.sum(-1, keepdim=True))
    assert torch.allclose(w.sum(-1), torch.full((7,), 2.5))
    one = MoEConfig(n_experts=16, top_k=1, expert_hidden=8, n_group=4, topk_group=2, routed_scaling=2.0)
    idx1, w1 = route(logits, None, one)  # top_k = 1: the raw score, not normalised to 1
    torch.testing.assert_close(w1, 2.0 * torch.sigmoid(logits).gather(1, idx1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_forward_equals_per_token_reference(dtype: torch.dtype) -> None:
    moe = make_moe(dtype=dtype)
    x = torch.randn(3, 9, 32, generator=torch.Generator().manual_seed(2)).to(dtype)
    with torch.no_grad():
        fast, ref = moe(x), moe_reference(moe, x)
    assert fast.shape == x.shape and fast.dtype == dtype
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(fast, ref, **tol)


def test_batched_forward_runs_each_expert_once_per_layer() -> None:
    moe = make_moe()
    calls = {e: 0 for e in range(16)}
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda m, a, o, e=e: calls.__setitem__(e, calls[e] + 1))
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        moe(x)
    assert max(calls.values()) == 1  # batched over experts: no expert called per token
    used = set(moe.gate(x.reshape(-1, 32))[0].flatten().tolist())
    assert {e for e, c in calls.items() if c} == used


def test_counter_sees_more_experts_for_more_tokens() -> None:
    moe = make_moe()
    x = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), count_experts(moe) as counter:
        moe(x[:, :1])
        moe(x)
    assert [u.tokens for u in counter.uses] == [1, 64]
    assert counter.uses[0].distinct == 4  # one token: exactly its top_k experts
    assert counter.uses[1].distinct > 4  # 64 tokens: the union of their choices ("expert explosion")
    assert counter.forwards() == 2 and counter.mean_tokens() == 32.5
    assert moe.log is None  # detached after the block
    with pytest.raises(ValueError, match="no mixture-of-experts layer"):
        with count_experts(torch.nn.Linear(2, 2)):
            pass


@pytest.mark.parametrize("bad, match", [
    (dict(n_experts=10, n_group=4), "not a multiple of n_group"),
    (dict(topk_group=5), "topk_group 5 exceeds n_group 4"),
    (dict(top_k=9), "exceeds the experts of the 2 kept group"),
    (dict(n_group=16, topk_group=2), "a group must hold >= 2 experts"),
    (dict(top_k=0), "top_k must be a positive int"),
])
def test_config_errors(bad: dict, match: str) -> None:
    base = dict(n_experts=16, top_k=4, expert_hidden=8, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match=match):
        MoEConfig(**{**base, **bad})
    with pytest.raises(NotImplementedError, match="score_function 'softmax' is not supported"):
        MoEConfig(**base, score_fn="softmax")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_grouped_matmuls_equal_the_expert_loop(monkeypatch, dtype: torch.dtype, tokens: int) -> None:
    """The grouped path (the experts' weights stacked, three grouped matmuls, no host sync) gives the
    loop over experts' values bit for bit on a CPU in half precision, with experts that get no token
    (1 and 5 tokens reach at most 4 and 16 of the 16 experts). float32 keeps the loop."""
    from dllm.eval.bench.counters import DispatchCounter
    from dllm.models.core.layer import moe as M

    moe = make_moe(dtype=dtype)
    x = torch.randn(1, tokens, 32, generator=torch.Generator().manual_seed(4)).to(dtype)
    with torch.inference_mode(), DispatchCounter() as counter:
        grouped = moe(x)
    assert moe._stacked is not None and counter.current.syncs == []  # the grouped path ran, reading nothing
    monkeypatch.setattr(M, "grouped_supported", lambda rows: False)
    with torch.inference_mode():
        loop = moe(x)
    assert torch.equal(grouped, loop)


def test_float32_keeps_the_loop() -> None:
    moe = make_moe()
    with torch.inference_mode():
        moe(torch.randn(1, 5, 32))
    assert moe._stacked is None  # a grouped matmul rounds float32 rows differently from the loop's


def test_the_stacked_weights_follow_the_parameters() -> None:
    moe = make_moe(dtype=torch.bfloat16)
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.inference_mode():
        before = moe(x)
    stacked = moe._stacked
    assert stacked is not None and moe.experts[3].up_proj.weight.data_ptr() == stacked.up.weight[3 * 24:].data_ptr()
    with torch.no_grad():  # an in-place load writes into the stacked memory
        moe.experts[3].up_proj.weight.mul_(2)
    with torch.inference_mode():
        assert not torch.equal(moe(x), before)
    moe = moe.to(torch.float16)  # new parameter memory: stacked again
    with torch.inference_mode():
        moe(x.to(torch.float16))
    assert moe._stacked is not stacked and moe._stacked.gate.weight.dtype == torch.float16
    with torch.enable_grad():  # autograd: the loop over experts
        assert moe.stacked_experts() is None


def test_moving_or_loading_the_moe_drops_its_stack() -> None:
    moe = make_moe(dtype=torch.bfloat16)
    x = torch.randn(1, 5, 32).to(torch.bfloat16)
    with torch.inference_mode():
        moe(x)
    assert moe._stacked is not None
    moe.float()  # float32 keeps the loop: the bf16 stack must not stay referenced
    assert moe._stacked is None
    moe = moe.to(torch.bfloat16)
    with torch.inference_mode():
        moe(x)
    state = {k: v.clone() for k, v in moe.state_dict().items()}
    moe.load_state_dict(state)
    assert moe._stacked is None  # decided again at the next forward

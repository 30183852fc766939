"""The merged forward (the fast path of continuous batching) against each call's own forward."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.serve.backends.scheduling.batcher import BatcherConfig, Pending, merged_forward, plan_groups


@pytest.fixture(scope="module", params=["tiny-llada", "tiny-dream"])
def model(request):
    return dllm.load(request.param)


def calls(model):
    g = torch.Generator().manual_seed(0)
    v = model.config.vocab_size
    shift = model.logit_shift
    out = []
    for b, t, rows in [(1, 9, None), (2, 14, (shift + 2, 8)), (1, 5, (shift, 5)), (3, 11, None)]:
        ids = torch.randint(5, v, (b, t), generator=g)
        kw = {"positions": torch.arange(t).expand(b, t), "key_padding_mask": None}
        if rows is not None:
            kw["logits_rows"] = rows
        out.append(Pending(ids, kw))
    # a call that is itself left-padded (a generate batch), with its own mask and positions
    ids = torch.randint(5, v, (2, 10), generator=g)
    kpm = torch.ones(2, 10, dtype=torch.bool)
    kpm[1, :3] = False
    pos = (kpm.long().cumsum(1) - 1).clamp_min(0)
    out.append(Pending(ids, {"positions": pos, "key_padding_mask": kpm}))
    return out


def forward_atol(model, want: torch.Tensor) -> float:
    """Absolute tolerance for two forwards of one model that batch differently (BLAS blocks the
    reductions differently by shape, and CPUs' kernels differ): the dtype's epsilon, grown with the
    square root of the reduction lengths the logits went through and scaled by their magnitude."""
    cfg = model.config
    depth = cfg.d_model * cfg.n_layers + cfg.mlp_hidden * cfg.n_layers
    return 8 * torch.finfo(want.dtype).eps * depth ** 0.5 * max(1.0, float(want.abs().max()))


def test_merged_forward_equals_each_forward(model):
    items = calls(model)
    with torch.inference_mode():
        merged = merged_forward(model, items)
        for item, got in zip(items, merged):
            want = model(item.input_ids, **item.kwargs).logits
            assert got.logits.shape == want.shape
            kpm = item.kwargs.get("key_padding_mask")
            if kpm is not None:  # pad columns' logits are meaningless in both
                keep = kpm[:, -want.shape[1]:] if "logits_rows" not in item.kwargs else None
                if keep is not None:
                    got_l, want_l = got.logits[keep], want[keep]
                    torch.testing.assert_close(got_l, want_l, rtol=0, atol=forward_atol(model, want_l))
                    continue
            torch.testing.assert_close(got.logits, want, rtol=0, atol=forward_atol(model, want))
            assert torch.equal(got.logits.argmax(-1), want.argmax(-1))


def test_plan_groups_bounds_and_padding():
    def item(b, t, **kw):
        return Pending(torch.zeros(b, t, dtype=torch.long), kw)

    a, b, c = item(2, 10), item(3, 10), item(1, 40)
    cached = item(1, 5, cache=object())
    groups = plan_groups([a, cached, b, c], BatcherConfig(max_rows=4, max_tokens=1000, call_cost_tokens=64))
    assert groups == [[cached], [a], [b], [c]]  # a + b = 5 rows > 4; a cached call runs alone; c: 30 pad columns
    groups = plan_groups([c, a, b], BatcherConfig(max_rows=64, max_tokens=1000, call_cost_tokens=64))
    assert groups == [[a, b], [c]]  # neighbouring lengths, shortest first; padding a, b to 40 costs 150 > 64
    groups = plan_groups([c, a, b], BatcherConfig(max_rows=64, max_tokens=1000, call_cost_tokens=200))
    assert groups == [[a, b, c]]  # one more call would cost more than the padding
    groups = plan_groups([a, b, c], BatcherConfig(max_rows=64, max_tokens=100, call_cost_tokens=10**6))
    assert groups == [[a, b], [c]]  # 6 rows x 40 columns > 100 tokens
    assert not item(1, 4, want_attn_layers=(0,)).mergeable and not item(1, 4, want_hidden_layers=(1,)).mergeable


def test_a_forward_with_soft_inputs_runs_alone():
    """merged_forward reads ids, positions, the mask and the logits rows only: a forward with soft inputs
    (DMax's mixed embeddings) merged with others would lose them and decode other tokens."""
    def item(**kw):
        return Pending(torch.zeros(1, 6, dtype=torch.long), {"positions": torch.arange(6)[None], **kw})

    soft = item(soft_inputs=object(), key_padding_mask=None, cache=None, want_attn_layers=())
    plain = item(key_padding_mask=None, cache=None, want_attn_layers=(), logits_rows=(1, 6), padded=False)
    assert not soft.mergeable and plain.mergeable
    groups = plan_groups([soft, plain, item()], BatcherConfig(call_cost_tokens=10**6))
    assert groups[0] == [soft] and len(groups) == 2


@pytest.mark.parametrize("field,value", [("max_rows", 0), ("max_tokens", -1), ("call_cost_tokens", -1),
                                         ("max_rows", True), ("call_cost_tokens", 1.5), ("call_cost_tokens", "fast")])
def test_batcher_config_refuses_bad_bounds(field, value):
    with pytest.raises(ValueError, match=field):
        BatcherConfig(**{field: value})


class _ClockedModel(torch.nn.Module):
    """A forward that costs ``fixed + per_token x tokens`` seconds of a fake clock (no sleeping)."""

    def __init__(self, fixed: float, per_token: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.fixed, self.per_token, self.now, self.calls = fixed, per_token, 0.0, []

    def forward(self, ids):
        self.calls.append(tuple(ids.shape))
        self.now += self.fixed + self.per_token * ids.numel()
        return ids


@pytest.mark.parametrize("fixed, per_token, expected", [(0.004, 50e-6, 80), (0.0, 1e-4, 0), (0.002, 0.0, 512 * 64)])
def test_the_call_cost_is_measured_from_two_forward_sizes(monkeypatch, fixed, per_token, expected):
    from dllm.serve.backends.scheduling import packing

    model = _ClockedModel(fixed, per_token)
    monkeypatch.setattr(packing.time, "perf_counter", lambda: model.now)
    assert packing.measure_call_cost(model) == expected  # a / b of t = a + b x tokens; no per-token cost: huge
    assert sorted(set(model.calls)) == [(1, 16), (8, 64)] and len(model.calls) == 8  # a warm-up and 3 each
    resolved = BatcherConfig(call_cost_tokens="auto").resolved(model)
    assert resolved.call_cost_tokens == expected and BatcherConfig(call_cost_tokens=7).resolved(model).call_cost_tokens == 7
    with pytest.raises(ValueError, match="growing size"):
        packing.measure_call_cost(model, shapes=((8, 64), (1, 16)))


def test_split_rows_cuts_a_running_decode_into_runs_of_consecutive_rows():
    from dllm.serve.backends.scheduling.batcher import split_rows

    config = BatcherConfig(max_rows=64, max_tokens=10_000, call_cost_tokens=64)
    assert split_rows([10, 12, 11, 40, 42], config) == [[0, 1, 2], [3, 4]]  # 36 + 84 + 2 calls < 5 x 42 + 1 call
    assert split_rows([40, 10, 42], config) == [[0, 1, 2]]  # in row order: a split saves less than a call
    assert split_rows([10, 12, 11, 40, 42], BatcherConfig(call_cost_tokens=10**6)) == [[0, 1, 2, 3, 4]]
    runs = split_rows([10] * 5, BatcherConfig(max_rows=2, call_cost_tokens=0))
    assert [r for run in runs for r in run] == list(range(5)) and len(runs) == 3 and max(map(len, runs)) == 2
    assert split_rows([500], BatcherConfig(max_tokens=100)) == [[0]]  # a row alone may exceed the bounds
    assert split_rows([], config) == []


def test_a_run_slowed_by_another_process_does_not_move_the_call_cost(monkeypatch):
    """The servers of ``dllm bench serve`` start together: a timed run another process interrupts only
    takes longer, and the fastest run of each shape is the one measured."""
    from dllm.serve.backends.scheduling import packing

    model = _ClockedModel(0.004, 50e-6)
    calls = {"n": 0}

    def forward(ids):  # runs 2 and 3 of the small shape (after its warm-up) lose 10 ms to another process
        calls["n"] += 1
        model.now += model.fixed + model.per_token * ids.numel() + (0.01 if calls["n"] in (2, 3) else 0.0)
        return ids

    monkeypatch.setattr(model, "forward", forward)
    monkeypatch.setattr(packing.time, "perf_counter", lambda: model.now)
    assert packing.measure_call_cost(model) == 80  # as undisturbed (the median would give 480)

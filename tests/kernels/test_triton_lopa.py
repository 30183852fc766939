"""LoPA's two selection kernels (``dllm.kernels.triton.lopa``, the static ``stats="fused"`` path) against
the torch ops of ``dllm.samplers.lopa`` on the same float32 statistics (the compacted path, which
runs those ops): the same commits and tokens for one step, on random and on tied confidences, rows
without masks, rows the anchor fills, fewer candidates than variants, with and without the guard and
the bonus. Plus the launch observer: a static ``fast`` step launches the vocabulary statistics once,
its anchor reading the statistics the last step's winner handed on."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.kernels.triton.launch import LAUNCH_OBSERVERS
from dllm.models import tiny
from dllm.samplers import make_sampler
from dllm.state import StepInput

from .conftest import DEVICE

V = 40
MASK = 39


def _step_input(logits: torch.Tensor, tokens: torch.Tensor, active: torch.Tensor, seed: int) -> StepInput:
    """A StepInput whose variant forward is a fixed function of each variant's canvas and row."""
    g = torch.Generator().manual_seed(seed)
    b, w = tokens.shape
    table = (torch.randn(b, w, V, generator=g) * 2).to(DEVICE)  # [B, W, V] per row
    emb = torch.randn(V, V, generator=g).to(DEVICE)  # [V, V] per canvas token

    def forward_variants(canvas: torch.Tensor, rows: torch.Tensor, n: int, every_row: bool = False,
                         host_rows=None) -> torch.Tensor:
        return table[rows] + emb[canvas].roll(1, dims=1)  # [R * n, W, V]: column c sees its left token

    return StepInput(logits=logits, tokens=tokens, active=active, query_start=0, window=(0, w), step=0,
                     steps=None, mask_id=MASK, temperature=0.0, generator=None, forward_variants=forward_variants)


def _case(kind: str, seed: int) -> StepInput:
    g = torch.Generator().manual_seed(seed)
    b, w = 4, 8
    logits = torch.randn(b, w, V, generator=g) * 3  # [B, W, V]
    active = torch.rand(b, w, generator=g) < 0.7
    if kind == "ties":  # every column alike: the ranking and the threshold's best tie everywhere
        logits = logits[:, :1].expand(b, w, V).clone()
    elif kind == "edge":  # row 0 without masks, row 1 with one, row 2 all confident (the anchor fills it)
        active[0] = False
        active[1] = False
        active[1, 5] = True
        logits[2] = 0.0
        logits[2, :, 3] = 30.0
        active[2] = True
    tokens = torch.randint(0, MASK, (b, w), generator=g)
    tokens[active] = MASK
    return _step_input(logits.to(DEVICE), tokens.to(DEVICE), active.to(DEVICE), seed)


_SLOW = pytest.mark.slow  # the interpreter runs the kernels' variant loop slowly: more variants under -m slow
OPTIONS = [{}, {"confidence": "max_prob"}, {"reuse": True}, pytest.param({"verify_variants": False}, marks=_SLOW),
           pytest.param({"branches": 6}, marks=_SLOW), pytest.param({"branches": 2, "bonus": False}, marks=_SLOW),
           pytest.param({"branches": 12, "tau_conf": 0.5}, marks=_SLOW)]


@pytest.mark.parametrize("kind", ["random", "ties", "edge"])
@pytest.mark.parametrize("options", OPTIONS,
                         ids=["default", "max_prob", "reuse", "noguard", "k6", "k2-nobonus", "k12-tau0.5"])
def test_the_kernels_decide_as_the_torch_ops(kind, options):
    for seed in range(2):
        inp = _case(kind, seed)
        kernels = make_sampler("lopa", stats="fused", compact=False, **options).step(inp, None)
        ops = make_sampler("lopa", stats="fused", compact=True, **options).step(inp, None)
        assert torch.equal(kernels.commit, ops.commit), (kind, seed, kernels.commit, ops.commit)
        assert torch.equal(kernels.tokens[kernels.commit], ops.tokens[ops.commit])
        if options.get("reuse"):  # the winner's logits, for the rows that keep masks (the rest are unread)
            left = (inp.active & ~kernels.commit).any(dim=1)
            assert torch.equal(kernels.next_logits[left], ops.next_logits[left])


def test_bad_arguments_are_refused():
    from dllm.kernels.triton.lopa import lopa_propose
    from dllm.kernels.triton.stats import vocab_stats

    st = vocab_stats(torch.randn(2, 4, V, device=DEVICE), banned=MASK)
    active = torch.ones(2, 4, dtype=torch.bool, device=DEVICE)
    cur = torch.full((2, 4), MASK, device=DEVICE)
    with pytest.raises(ValueError, match="n_extra must be in"):
        lopa_propose(st.idx, st.val, active, cur, 5, 0.9, "max_prob")
    with pytest.raises(ValueError, match="confidence must be"):
        lopa_propose(st.idx, st.val, active, cur, 1, 0.9, "margin")
    with pytest.raises(ValueError, match="must match active"):
        lopa_propose(st.idx, st.val, active[:1], cur, 1, 0.9, "max_prob")
    with pytest.raises(ValueError, match="statistics must be"):
        lopa_propose(st.idx, st.val, active[:1], cur[:1], 1, 0.9, "max_prob")
    with pytest.raises(ValueError, match="rows must be a long tensor"):
        lopa_propose(st.idx, st.val, active, cur, 1, 0.9, "max_prob", rows=torch.zeros(3, dtype=torch.long))


def test_out_buffers_are_written_in_place_and_checked():
    from dllm.kernels.triton.lopa import lopa_propose, lopa_select, propose_buffers, select_buffers
    from dllm.kernels.triton.stats import vocab_stats

    inp = _case("random", 0)
    st = vocab_stats(inp.logits, banned=MASK)
    fresh = lopa_propose(st.idx, st.val, inp.active, inp.tokens, 2, 0.6, "negative_entropy")
    given = propose_buffers(4, 3, 8, st.val.device)
    into = lopa_propose(st.idx, st.val, inp.active, inp.tokens, 2, 0.6, "negative_entropy", out=given)
    assert all(a is b for a, b in zip(into, given)) and all(torch.equal(a, b) for a, b in zip(into, fresh))
    variants, at, anchor = fresh
    v = vocab_stats(inp.forward_variants(variants.view(12, 8), torch.arange(4).repeat_interleave(3), 3),
                    banned=MASK)  # [N * k, W]
    args = (v.idx, v.val, st.idx, inp.active, variants, at, anchor, 0.6, "negative_entropy", True, True)
    given = select_buffers(4, 8, st.val.device)
    into, fresh = lopa_select(*args, out=given), lopa_select(*args)
    assert all(a is b for a, b in zip(into, given)) and all(torch.equal(a, b) for a, b in zip(into, fresh))
    commit, tokens, win = given
    for bad in [(commit.long(), tokens, win), (commit, tokens[:3], win), (commit, tokens.t(), win), (commit, tokens)]:
        with pytest.raises(ValueError, match="lopa_select: out must be contiguous tensors"):
            lopa_select(*args, out=bad)
    with pytest.raises(ValueError, match="lopa_propose: out must be contiguous tensors"):
        lopa_propose(st.idx, st.val, inp.active, inp.tokens, 2, 0.6, "max_prob", out=propose_buffers(4, 2, 8, DEVICE))


def test_select_refuses_strided_or_misshapen_proposals():
    """lopa_select reads variants / at / anchor row-major and the step's arg-max at offset 0 of each
    row: a strided view (here of a wider buffer) read so gave other commits, silently."""
    from dllm.kernels.triton.lopa import lopa_propose, lopa_select
    from dllm.kernels.triton.stats import vocab_stats

    inp = _case("random", 0)
    st = vocab_stats(inp.logits, banned=MASK)
    variants, at, anchor = lopa_propose(st.idx, st.val, inp.active, inp.tokens, 2, 0.6, "negative_entropy")
    v = vocab_stats(inp.forward_variants(variants.view(12, 8), torch.arange(4).repeat_interleave(3), 3),
                    banned=MASK)
    wide = torch.zeros(4, 16, dtype=torch.bool, device=DEVICE)
    wide[:, 3:11] = anchor
    tail = (0.6, "negative_entropy", True, True)
    for bad in [(variants, at, wide[:, 3:11]), (variants, torch.cat([at, at], 1)[:, :3], anchor),
                (torch.cat([variants, variants], 2)[:, :, :8], at, anchor), (variants, at.int(), anchor)]:
        with pytest.raises(ValueError, match="variants / at / anchor must be lopa_propose's contiguous"):
            lopa_select(v.idx, v.val, st.idx, inp.active, *bad, *tail)
    with pytest.raises(ValueError, match="statistics must be"):
        lopa_select(v.idx, v.val, st.idx[:2], inp.active, variants, at, anchor, *tail)
    with pytest.raises(ValueError, match="active must be"):
        lopa_select(v.idx, v.val, st.idx, inp.active[:, :7], variants, at, anchor, *tail)
    with pytest.raises(ValueError, match="unit stride over the last dim"):
        lopa_propose(st.idx, torch.cat([st.val, st.val], 2)[..., ::2], inp.active, inp.tokens, 2, 0.6, "max_prob")


def test_a_decode_stepping_the_sampler_meanwhile_changes_no_decision():
    """The fused static step hands its buffers on to the next step of the sampler, whoever makes it: a
    decode stepping the same sampler between two steps of another (a served greenlet) takes them, and
    the other's next step recomputes its anchor instead of reading what was overwritten."""
    a, b = _case("random", 0), _case("edge", 1)
    alone = make_sampler("fast", stats="fused", compact=False)
    first = alone.step(a, None)  # its commit and tokens are buffers the sampler's next step rewrites
    first_commit = first.commit.clone()
    a2 = _step_input(first.next_logits, torch.where(first.commit, first.tokens, a.tokens), a.active & ~first.commit, 0)
    want = alone.step(a2, None)
    shared = make_sampler("fast", stats="fused", compact=False)
    got_first = shared.step(a, None)
    assert torch.equal(got_first.commit, first_commit)
    a2 = _step_input(got_first.next_logits, torch.where(got_first.commit, got_first.tokens, a.tokens),
                     a.active & ~got_first.commit, 0)
    shared.step(b, None)  # the other decode, between the two steps
    got = shared.step(a2, None)
    assert torch.equal(got.commit, want.commit) and torch.equal(got.tokens[got.commit], want.tokens[want.commit])


def test_statistics_read_through_rows_equal_the_gathered_rows():
    """The carried path: row n's statistics read at row ``rows[n]`` of a larger batch, in place."""
    from dllm.kernels.triton.lopa import lopa_propose, lopa_select
    from dllm.kernels.triton.stats import vocab_stats

    g = torch.Generator().manual_seed(4)
    big = vocab_stats((torch.randn(6, 8, V, generator=g) * 3).to(DEVICE), banned=MASK)  # [M, W]
    rows = torch.tensor([4, 1, 5], device=DEVICE)
    active = (torch.rand(3, 8, generator=g) < 0.8).to(DEVICE)
    cur = torch.where(active, MASK, 3)
    via_rows = lopa_propose(big.idx, big.val, active, cur, 2, 0.6, "negative_entropy", rows)
    gathered = lopa_propose(big.idx[rows], big.val[rows], active, cur, 2, 0.6, "negative_entropy")
    assert all(torch.equal(a, b) for a, b in zip(via_rows, gathered))
    variants, at, anchor = gathered
    v = vocab_stats((torch.randn(3 * 3, 8, V, generator=g) * 3).to(DEVICE), banned=MASK)  # [N * k, W]
    picks = [lopa_select(v.idx, v.val, big.idx, active, variants, at, anchor, 0.6, "negative_entropy", True, True,
                         rows),
             lopa_select(v.idx, v.val, big.idx[rows], active, variants, at, anchor, 0.6, "negative_entropy", True,
                         True)]
    assert all(torch.equal(a, b) for a, b in zip(*picks))


class _Launches:
    def __init__(self) -> None:
        self.names: list[str] = []

    def launch_begins(self, name: str) -> None:
        self.names.append(name)

    def launch_ends(self, name: str) -> None:
        pass


def test_a_static_fast_step_reads_the_vocabulary_once():
    """With reuse, the anchor of a step is made from the statistics of the logits the last step's
    winner handed on: one ``vocab_stats`` launch per step (the variants'), two at a block's first step."""
    model = tiny("llada", seed=3).to(DEVICE)
    seen = _Launches()
    LAUNCH_OBSERVERS.append(seen)
    try:
        out = dllm.generate(model, [[11, 12, 13, 14]], sampler="fast", compact=False, stats="fused", gen_length=8,
                            block_length=4)
    finally:
        LAUNCH_OBSERVERS.remove(seen)
    blocks = 2
    n_select = seen.names.count("lopa_select")
    assert seen.names.count("lopa_propose") == n_select > blocks
    assert seen.names.count("vocab_stats") == n_select + blocks, seen.names
    assert (out.generated != model.mask_id).all()


def test_block_mode_on_the_kernels_skips_the_filled_blocks_variants():
    """compact="block" on the fused static path: the anchor of ``lopa_propose`` read at a block's first
    step, no variant forward where it fills every block; the static path's tokens."""
    model = tiny("llada", seed=3).to(DEVICE)
    kw = dict(sampler="fast", stats="fused", gen_length=12, block_length=4, cache="dual", tau_conf=0.05)
    prompts = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]
    static = dllm.generate(model, prompts, compact=False, **kw)
    block = dllm.generate(model, prompts, compact="block", **kw)
    assert torch.equal(block.sequences, static.sequences)
    assert block.nfe < static.nfe


def test_auto_takes_the_kernels_only_where_the_probe_passed(monkeypatch):
    """stats="auto" runs LoPA's kernels on a device once a probe has run them there and found the torch
    ops' decisions; a kernel that fails (here: made to raise) leaves auto on the torch ops, with one
    warning naming why, and the same tokens."""
    import dllm.kernels.triton.lopa as kernels
    import dllm.samplers.lopa as lopa
    from dllm.samplers import lopa_probe

    assert lopa_probe.kernels_refused(str(torch.device(DEVICE)), lopa.LoPA) is None  # the interpreter here
    model = tiny("llada", seed=3).to(DEVICE)
    prompts = [[11, 12, 13, 14, 15, 16], [21, 22, 23]]
    kw = dict(gen_length=12, block_length=4, cache="dual")
    want = dllm.generate(model, prompts, sampler="fast:compact=True,stats=fused", **kw)

    def broken(*args, **kwargs):
        raise RuntimeError("the kernel did not compile")

    monkeypatch.setattr(lopa, "use_fused", lambda choice, logits: choice != "torch")  # auto fused on a CPU too
    monkeypatch.setattr(kernels, "lopa_propose", broken)
    lopa_probe.kernels_refused.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="the kernel did not compile"):
            got = dllm.generate(model, prompts, sampler="fast:compact=False", **kw)  # stats="auto"
        assert torch.equal(got.sequences, want.sequences)
        with pytest.raises(RuntimeError, match="did not compile"):  # asked for outright: the error is the caller's
            dllm.generate(model, prompts, sampler="fast:compact=False,stats=fused", **kw)
    finally:
        lopa_probe.kernels_refused.cache_clear()
        lopa_probe._warn_once.cache_clear()


def test_a_running_decode_hands_its_rows_carried_logits_on_as_they_are():
    """A served decode whose every row carries its logits passes them on as the very object LoPA handed
    on, so the anchor reads the kept statistics there too (no second pass over the vocabulary)."""
    from dllm.engine.running import RunningDecode, group_of
    from dllm.settings import DecodeSettings

    model = tiny("llada", seed=3).to(DEVICE)
    settings = DecodeSettings(sampler="fast:compact=False,stats=fused", block_length=8)
    decode = RunningDecode(model, settings, group_of(model, settings, 16))
    for i, prompt in enumerate([[11, 12, 13, 14], [21, 22, 23, 24, 25]]):
        decode.add(prompt, 16, i)
    seen = _Launches()
    LAUNCH_OBSERVERS.append(seen)
    try:
        with torch.inference_mode():
            while len(decode):
                decode.step()
    finally:
        LAUNCH_OBSERVERS.remove(seen)
    steps = seen.names.count("lopa_select")
    assert steps > 4 and seen.names.count("vocab_stats") < 1.5 * steps, seen.names

"""dllm/engine/graphs.py: the static cached step (captured as CUDA graphs on a GPU) against the ordinary path
(run as cuda_graphs="check": every replay also checked against its capture, dllm/engine/graph_check.py)."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.engine import graphs
from dllm.engine.graphs import GRAPHS_KEY
from dllm.models.tiny import tiny

_RUNS = [("llada", "dual"), ("llada", "prefix"), ("llada", "window"), ("dream", "dual"), ("sdar", "block"),
         ("fastdllm_v2", "block")]


def _decode(model, prompts, mode, **kw):
    seen = {}
    out = dllm.generate(model, prompts, return_trace=True, cuda_graphs=mode,
                        callback=lambda st: seen.setdefault("g", st.extras.get(GRAPHS_KEY)), **kw)
    return out, seen.get("g")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sampler", ["low_confidence", "threshold", "fast", "fast:compact=False"])
@pytest.mark.parametrize("family,cache", _RUNS)
def test_static_step_gives_the_eager_tokens(family, cache, sampler, dtype):
    model = tiny(family, dtype=dtype)
    block = 4 if family == "sdar" else 8
    prompts = [list(range(10, 22)), list(range(22 - 12 + block, 22))]  # ragged, left padded
    kw = dict(sampler=sampler, cache=cache, gen_length=16, block_length=block)
    eager, _ = _decode(model, prompts, False, **kw)
    static, g = _decode(model, prompts, "check", **kw)  # "static", each replay checked against its capture
    assert torch.equal(eager.sequences, static.sequences) and torch.equal(eager.trace, static.trace)
    assert eager.nfe == static.nfe and eager.forwarded_tokens == static.forwarded_tokens
    assert g is not None and g.captures <= graphs.MAX_GRAPHS
    assert g.first_runs >= 1  # each shape's first forward runs the static step eagerly (the warm-up)
    if cache in ("dual", "window") and sampler != "fast":  # one shape serves a call's blocks: captured
        assert g.captures >= 1  # (fast's later steps read its verification variants' logits)
    variants = [k for k in g._graphs if k[0] == "variants"]
    # fast's stacked variant forwards of every row are captured too (always with static shapes; compacted,
    # when every row is live), except under a block-causal mask
    if sampler == "fast:compact=False" and family in ("llada", "dream"):
        assert variants, g._graphs.keys()
    if not sampler.startswith("fast") or family not in ("llada", "dream"):
        assert not variants, g._graphs.keys()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_variant_forward_is_captured_once_for_every_block_of_the_dual_cache(family):
    """fast as on CUDA (static variant batches): one capture of its stacked variant forward serves every
    block (the dual cache attends to the whole canvas), replayed at every later step, same tokens."""
    model = tiny(family, dtype=torch.bfloat16)
    kw = dict(sampler="fast:compact=False", cache="dual", gen_length=32, block_length=8)
    eager, _ = _decode(model, [list(range(10, 22)), list(range(14, 22))], False, **kw)
    static, g = _decode(model, [list(range(10, 22)), list(range(14, 22))], "static", **kw)
    assert torch.equal(eager.sequences, static.sequences) and torch.equal(eager.trace, static.trace)
    captured = [k for k in g._graphs if k[0] == "variants"]
    assert len(captured) == 1 and g.replays > 0


def test_dual_captures_one_shape_for_every_block_and_replays_it():
    model = tiny("llada")
    out, g = _decode(model, [list(range(10, 20))], "static", sampler="low_confidence", cache="dual",
                     gen_length=32, block_length=8, steps=32)
    assert g.shapes == 1 and g.captures == 1 and g.first_runs == 1
    assert g.replays == out.nfe - 4 - 2  # every cached forward but the first and the captured (4 block refreshes)


def test_classifier_free_guidance_and_released_rows():
    model = tiny("llada", seed=3)
    prompts = [list(range(10, 20)), list(range(12, 20))]
    for kw in (dict(cfg_scale=1.5), dict(stop_at_eos=True)):
        eager, _ = _decode(model, prompts, False, cache="dual", gen_length=16, block_length=4, **kw)
        static, _ = _decode(model, prompts, "static", cache="dual", gen_length=16, block_length=4, **kw)
        assert torch.equal(eager.sequences, static.sequences), kw


def test_more_shapes_than_the_bound_run_eagerly(monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    model = tiny("llada")
    kw = dict(sampler="low_confidence", cache="prefix", gen_length=24, block_length=4, steps=24)  # 6 key lengths
    eager, _ = _decode(model, [list(range(10, 20))], False, **kw)
    static, g = _decode(model, [list(range(10, 20))], "static", **kw)
    assert torch.equal(eager.sequences, static.sequences)
    assert g.shapes == 2


def test_no_new_shape_is_taken_once_the_graphs_are_full(monkeypatch):
    """The prefix cache attends to a longer prefix every block: with room for one graph, the first
    block's shape is run, captured and replayed, and no later block's shape is even run statically."""
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 1)
    model = tiny("llada")
    kw = dict(sampler="low_confidence", cache="prefix", gen_length=16, block_length=4, steps=16)  # 4 blocks
    eager, _ = _decode(model, [list(range(10, 20))], False, **kw)
    static, g = _decode(model, [list(range(10, 20))], "static", **kw)
    assert torch.equal(eager.sequences, static.sequences)
    assert (g.first_runs, g.captures, g.shapes, len(g._graphs)) == (1, 1, 1, 1) and g.replays >= 1


def test_shapes_seen_once_are_bounded_and_never_captured(monkeypatch):
    """SDAR's block cache with threshold forwards each block's shape once on the tiny model: each is run
    statically, none is captured; past MAX_SHAPES later shapes run as before."""
    monkeypatch.setattr(graphs, "MAX_SHAPES", 2)
    model = tiny("sdar")
    kw = dict(sampler="threshold", cache="block", gen_length=16, block_length=4)
    eager, _ = _decode(model, [list(range(10, 22))], False, **kw)
    static, g = _decode(model, [list(range(10, 22))], "static", **kw)
    assert torch.equal(eager.sequences, static.sequences)
    assert (g.first_runs, g.captures, g.replays, len(g._graphs)) == (2, 0, 0, 2)


def test_bad_values_are_refused():
    model = tiny("llada")
    with pytest.raises(ValueError, match="cuda_graphs must be False, True, 'static' .* or 'check' .*, got 'yes'"):
        dllm.generate(model, [[5, 6]], gen_length=4, cuda_graphs="yes")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda_graphs=True captures CUDA graphs, but the model is on cpu"):
            dllm.generate(model, [[5, 6]], gen_length=4, cuda_graphs=True)


def test_no_cache_has_nothing_to_capture():
    model = tiny("llada")
    out, g = _decode(model, [[5, 6, 7]], "static", gen_length=4)
    assert g is None and out.nfe == 4


# (family, cache, sampler, captures and replays expected): the dual cache's one shape serves every block; a
# block-causal cache has a new shape every block, captured at its second cached step and replayed at its
# third: never where each block takes one cached step (threshold and fast fill the tiny models' blocks so)
_CUDA_CASES = [("llada", "dual", "threshold", True), ("llada", "dual", "fast:compact=False", True),
               ("sdar", "block", "threshold", False), ("sdar", "block", "fast:compact=False", False),
               ("sdar", "block", "low_confidence", True), ("llada2", "block", "low_confidence", True)]


def test_the_cuda_cases_replay_where_expected_as_the_static_step_does():
    """The CUDA test's expectations, checked here on the static step (the same captures and replays)."""
    for family, cache, sampler, replays in _CUDA_CASES:
        model = tiny(family, dtype=torch.bfloat16)
        kw = dict(sampler=sampler, cache=cache, gen_length=16, block_length=4 if cache == "block" else 8)
        _, g = _decode(model, [list(range(10, 22))], "static", **kw)
        assert g.refused is None and g.first_runs >= 1, (family, sampler)
        assert (g.captures > 0) == (g.replays > 0) == replays, (family, sampler, g.captures, g.replays)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family,cache,sampler,replays", _CUDA_CASES)
def test_cuda_graphs_give_the_eager_tokens(family, cache, sampler, replays):
    """Real CUDA graphs give the eager tokens, capturing and replaying what the static step run eagerly on
    the same GPU does (the GPU's bfloat16 confidences may end a block in another number of steps than a
    CPU's, which moves the captures of the adaptive samplers: ``replays`` is what this CPU expects)."""
    model = tiny(family, dtype=torch.bfloat16).cuda()
    kw = dict(sampler=sampler, cache=cache, gen_length=16, block_length=4 if cache == "block" else 8)
    eager, _ = _decode(model, [list(range(10, 22))], False, **kw)
    graphed, g = _decode(model, [list(range(10, 22))], True, **kw)
    _, s = _decode(model, [list(range(10, 22))], "static", **kw)
    assert torch.equal(eager.sequences, graphed.sequences)
    if g.refused is None:  # LLaDA 2's experts are captured on sm90 / sm100 only (grouped matmuls)
        assert (g.first_runs, g.captures, g.replays) == (s.first_runs, s.captures, s.replays)
        if sampler == "low_confidence":  # a step budget: the same steps on any device
            assert (g.captures > 0) == (g.replays > 0) == replays, (g.captures, g.replays)


@pytest.mark.parametrize("family", ["llada", pytest.param("dream", marks=pytest.mark.slow)])
def test_static_step_with_lopas_kernels_gives_the_eager_tokens(family):
    """fast as CUDA runs it (static variant batches on the fused statistics and LoPA's selection kernels,
    interpreted here) under the static step: the captured variant forward reads the ids the kernels
    wrote, and the carried statistics are those of the replayed logits."""
    model = tiny(family, seed=3)
    prompts = [[11, 12, 13, 14, 15, 16], [21, 22, 23]]
    kw = dict(sampler="fast:compact=False,stats=fused", cache="dual", gen_length=16, block_length=8)
    eager, _ = _decode(model, prompts, False, **kw)
    static, g = _decode(model, prompts, "static", **kw)
    reference = dllm.generate(model, prompts, **{**kw, "sampler": "fast:compact=False"})
    assert torch.equal(eager.sequences, static.sequences) and torch.equal(static.sequences, reference.sequences)
    assert eager.nfe == static.nfe == reference.nfe
    assert [k for k in g._graphs if k[0] == "variants"]

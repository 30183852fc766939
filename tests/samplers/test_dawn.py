"""DAWN's dependency-aware rule: hand-built attention (a chain of dependencies, sinks, pads, the
independent set), option checks, end-to-end decoding, and the error without attention maps."""

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts
from dllm.samplers import make_sampler
from dllm.samplers.dawn import dependency_graph, greedy_mis, greedy_mis_by_picks
from dllm.schedule import LOGIT_SHIFT_KEY

from builders import MASK, V, decode_state, step_input

# canvas (one row, no pads): prompt 0-2, decoded 3, masks 4-9; block = columns 3..9
#          pos:   0    1     2    3     4    5     6     7     8     9
CONF = [0.5, 0.99, 0.5, 0.95, 0.8, 0.95, 0.85, 0.88, 0.86, 0.8]
TOKS = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
EDGES = {(4, 3): 0.2, (5, 3): 0.2, (6, 5): 0.2, (8, 7): 0.2, (9, 8): 0.2}  # (i, j): i <- j


def _attention(pads):
    """[L, L] attention of the canvas above after ``pads`` left pads: a sink column (1), the
    diagonal, the dependency edges; a pad query row puts junk on the anchor's column."""
    n = len(CONF) + pads
    a = torch.zeros(n, n)
    for i in range(pads, n):
        a[i, pads + 1] = 0.5  # every real query looks at position 1: an attention sink
        a[i, i] = 0.3
    for (i, j), w in EDGES.items():
        a[pads + i, pads + j] = w
    for p in range(pads):
        a[p, pads + 3] = 5.0  # pads must not count in the column means
    return a


def _case(pads=0):
    n = len(CONF) + pads
    logits = torch.zeros(1, n, V)
    tokens = torch.full((1, n), MASK)
    for i, (c, t) in enumerate(zip(CONF, TOKS)):
        row = torch.full((V,), (1 - c) / (V - 1))
        row[t] = c
        logits[0, pads + i] = torch.log(row)
        if i < 4:
            tokens[0, pads + i] = t
    tokens[0, :pads] = 0
    real = torch.ones(1, n, dtype=torch.bool)
    real[0, :pads] = False
    lp = 3 + pads
    state = decode_state(tokens.clone(), prompt_length=lp, key_padding_mask=real)  # the block: lp .. n
    a = _attention(pads)[None, None]  # [1, H=1, L, L]
    attn = {2: 2 * a, 3: torch.zeros_like(a)}  # layer mean = a
    inp = step_input(logits, tokens=tokens, window=(lp, n), attn=attn)
    return inp, state


def _committed(out, pads=0):
    return out.commit[0, pads:].nonzero().flatten().tolist()


def test_dependency_graph_removes_sinks_self_edges_and_pads():
    a = _attention(1)[None]  # [1, 11, 11], one pad
    real = torch.tensor([[False] + [True] * 10])
    e = dependency_graph(a, real, 0, tau_sink=0.2, tau_edge=0.07)[0]
    assert not e[:, 2].any()  # the sink column (position 1) is gone
    assert not e.diagonal().any()
    assert not e[0].any() and not e[:, 0].any()  # the pad has no edges
    assert sorted((i - 1, j - 1) for i, j in e.nonzero().tolist()) == sorted(EDGES)
    # counting the pad row, the anchor's column mean would pass tau_sink and erase its edges
    e_all = dependency_graph(a, torch.ones_like(real), 0, tau_sink=0.2, tau_edge=0.07)[0]
    assert not e_all[:, 4].any()


def _greedy_mis_loop(cand, conflict, score):
    """DAWN's loop for one row in Python: candidates by score (descending, leftmost on ties), each
    kept unless a kept one conflicts with it."""
    order = sorted((i for i in range(len(cand)) if cand[i]), key=lambda i: (-score[i], i))
    kept = []
    for i in order:
        if not any(conflict[i][j] for j in kept):
            kept.append(i)
    return [i in kept for i in range(len(cand))]


@pytest.mark.parametrize("seed", range(6))
def test_greedy_mis_fixed_point_equals_the_picks_and_the_loop(seed):
    g = torch.Generator().manual_seed(seed)
    b, n = 16, 4 + seed * 5  # up to 29 positions; dense and sparse graphs, repeated scores (ties)
    upper = torch.rand(b, n, n, generator=g) < torch.rand(b, 1, 1, generator=g)
    conflict = torch.triu(upper, 1)
    conflict = conflict | conflict.transpose(1, 2)
    cand = torch.rand(b, n, generator=g) < 0.8
    score = torch.randint(0, 4, (b, n), generator=g).double() / 4
    score[0] = 0.5  # every candidate tied: the leftmost order decides
    conflict[1] = ~torch.eye(n, dtype=torch.bool)  # a clique: one pick
    fast = greedy_mis(cand, conflict, score, rounds=n)
    assert torch.equal(fast, greedy_mis_by_picks(cand, conflict, score, rounds=n))
    for r in range(b):
        assert fast[r].tolist() == _greedy_mis_loop(cand[r].tolist(), conflict[r].tolist(), score[r].tolist())


def test_greedy_mis_a_chain_ranked_against_its_order_needs_every_round():
    # a path 0-1-...-7 with scores rising along it: 7 is kept, which drops 6, keeps 5, ... a chain of 7
    # earlier-ranked links, the longest a row of 8 can have, settled only by the last round
    n = 8
    conflict = torch.zeros(1, n, n, dtype=torch.bool)
    for i in range(n - 1):
        conflict[0, i, i + 1] = conflict[0, i + 1, i] = True
    cand = torch.ones(1, n, dtype=torch.bool)
    score = torch.arange(n, dtype=torch.float64)[None]
    want = [i % 2 == 1 for i in range(n)]
    assert greedy_mis(cand, conflict, score, rounds=n)[0].tolist() == want
    assert greedy_mis(cand, conflict, score, rounds=n - 1)[0].tolist() != want  # one round short


def test_greedy_mis_batched():
    chain = torch.zeros(4, 4, dtype=torch.bool)
    for i in range(3):
        chain[i, i + 1] = chain[i + 1, i] = True
    conflict = chain.expand(3, 4, 4)
    cand = torch.tensor([[True] * 4, [True] * 4, [False] * 4])
    score = torch.tensor([[0.5, 0.9, 0.8, 0.7], [0.9, 0.5, 0.5, 0.9], [0.9, 0.9, 0.9, 0.9]])
    chosen = greedy_mis(cand, conflict, score, rounds=4)
    assert torch.equal(chosen, greedy_mis_by_picks(cand, conflict, score, rounds=4))
    assert chosen.tolist() == [
        [False, True, False, True],  # 1 first (drops 0, 2), then 3
        [True, False, False, True],  # 0 and 3 tie: leftmost first (drops 1), then 3 (drops 2)
        [False] * 4,  # no candidates: nothing, no index-0 filler
    ]


def test_anchor_induction_blocking_and_independent_set():
    inp, state = _case()
    out = make_sampler("dawn", tau_sink=0.2).step(inp, state)
    # S_high {5}; anchors {1, 3} (1's column is a sink); S_ind {4, 5}; 6 <- 5 is blocked;
    # candidates {7, 8, 9} with conflicts 7-8, 8-9: the independent set {7, 9}
    assert _committed(out) == [4, 5, 7, 9]
    assert out.tokens[0, 4:].tolist() == TOKS[4:]
    out = make_sampler("dawn", tau_sink=0.2, tau_low=0.87).step(*_case())
    assert _committed(out) == [4, 5, 7]  # 8 and 9 are no longer candidates


def test_without_induction_the_independent_set_decides():
    inp, state = _case()
    out = make_sampler("dawn", tau_sink=0.2, tau_induce=0.99).step(inp, state)
    # S_high {5}; no S_ind, nothing blocked; candidates {4, 6, 7, 8, 9}: 7, 6, then 4 and 9 (tie)
    assert _committed(out) == [4, 5, 6, 7, 9]


def test_a_kept_sink_makes_every_mask_induced():
    inp, state = _case()
    out = make_sampler("dawn", tau_sink=1.0).step(inp, state)  # position 1 (c 0.99) stays an anchor
    assert _committed(out) == [4, 5, 6, 7, 8, 9]


def test_left_padding_gives_the_same_decision():
    alone = make_sampler("dawn", tau_sink=0.2).step(*_case(0))
    padded = make_sampler("dawn", tau_sink=0.2).step(*_case(1))
    assert _committed(alone) == _committed(padded, pads=1) == [4, 5, 7, 9]


def _first_position_anchor(pads):
    """The canvas above with position 0 (the first real one) predicted at 0.95 and mask 6 attending to it."""
    inp, state = _case(pads)
    row = torch.full((V,), 0.05 / (V - 1))
    row[TOKS[0]] = 0.95
    inp.logits[0, pads] = torch.log(row)
    inp.attn[2][0, 0, pads + 6, pads] += 0.8  # layer mean 0.4; column mean 0.04: no sink
    return inp, state


def test_the_first_real_position_is_an_anchor_unless_the_logits_are_shifted():
    # as DAWN (tests/samplers/test_dawn_upstream.py): 6 is induced by position 0, alone and after a pad; under a
    # logit shift (Dream) the first real position's logits are a placeholder: no anchor
    for pads in (0, 1):
        out = make_sampler("dawn", tau_sink=0.2).step(*_first_position_anchor(pads))
        assert _committed(out, pads) == [4, 5, 6, 7, 9], pads
        inp, state = _first_position_anchor(pads)
        state.extras[LOGIT_SHIFT_KEY] = 1
        assert _committed(make_sampler("dawn", tau_sink=0.2).step(inp, state), pads) == [4, 5, 7, 9], pads


def test_missing_attention_is_a_clear_error():
    inp, state = _case()
    inp.attn = {}
    with pytest.raises(RuntimeError, match="sampler 'dawn' needs the attention probabilities"):
        make_sampler("dawn").step(inp, state)


@pytest.mark.parametrize("options,match", [
    (dict(tau_sink=-0.1), r"tau_sink must be a number in \[0, 1\], got -0.1"),
    (dict(tau_edge=0.0), r"tau_edge must be a number in \(0, 1\], got 0.0"),
    (dict(tau_induce=1.5), r"tau_induce must be a number in \[0, 1\], got 1.5"),
    (dict(tau_low="0.7"), r"tau_low must be a number in \[0, 1\], got '0.7'"),
    (dict(layers=0), r"layers must be an integer in \[1, 1024\], got 0"),
    (dict(layers=10**9), r"layers must be an integer in \[1, 1024\], got 1000000000"),  # never a 10**9 list
])
def test_out_of_range(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("dawn", **options)


def test_attention_layers_follow_the_option():
    assert make_sampler("dawn").attention_layers == (-4, -3, -2, -1)
    assert make_sampler("dawn", layers=2).attention_layers == (-2, -1)


# ---- end to end ------------------------------------------------------------------------------------
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_four_layers_decode_to_the_end_and_batch_equals_alone(family):
    # the contract tests run dawn on the 2-layer tiny models; here it reads 4 layers of attention
    model = tiny(family, seed=1, n_layers=4)
    kw = dict(gen_length=8, block_length=4)
    out = dllm.generate(model, PROMPTS, sampler="dawn", **kw)
    assert (out.generated != model.mask_id).all() and out.nfe <= 8
    for j, p in enumerate(PROMPTS):
        alone = dllm.generate(model, [p], sampler="dawn", **kw)
        assert torch.equal(out.generated[j], alone.generated[0]), j


def test_model_shallower_than_the_default_layers_uses_all_its_layers():
    # "the last 4 layers" of a 2-layer model are its 2 layers (the engine fits the request)
    model = tiny("llada", seed=1)
    default = dllm.generate(model, PROMPTS, sampler="dawn", gen_length=4)
    explicit = dllm.generate(model, PROMPTS, sampler="dawn", gen_length=4, layers=2)
    assert torch.equal(default.sequences, explicit.sequences)


def test_oracle_has_no_attention_maps():
    exs = T.test_split("copy", 4, 2)
    match = r"sampler .dawn. reads the model.s attention probabilities .* OracleLM has no transformer layers"
    with pytest.raises(ValueError, match=match):
        dllm.generate(OracleLM(), oracle_prompts(exs), sampler="dawn", gen_length=4)


def test_defaults_are_those_of_dawns_generate():
    """lizhuo-luo/DAWN ``llada/generate.py``: ``generate(..., tau_sink=0.01, tau_edge=0.07,
    tau_induce=0.7, tau_low=0.7)`` (and ``get_transfer_index_dawn``'s, the same); tau_high is the
    hard-coded 0.9. tau_low was 0.75 (the GSM8K script's value) until 2026-12-03."""
    from dataclasses import asdict

    assert asdict(make_sampler("dawn").config) == dict(tau_sink=0.01, tau_edge=0.07, tau_induce=0.7, tau_low=0.7,
                                                       tau_high=0.9, layers=4)

"""lopa: threshold anchor + lookahead variants (LoPA's branches), one batched variant forward per step."""

import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.eval.bench.counters import count_generate
from dllm.models import tiny
from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
from dllm.samplers import make_sampler

from builders import MASK, log_probs, prob_row, step_input

M = MASK


def _logits(rows):
    """[W] rows of (p_top, tok) -> logits [W, V] (log-probabilities, float32)."""
    return log_probs([prob_row(p, t) for p, t in rows])


class StubVariants:
    """``forward_variants`` that records every call and answers from a canvas -> logits table."""

    def __init__(self, table, default=None):
        self.table = {tuple(k): _logits(v) for k, v in table.items()}
        self.default = default  # logits rows of canvases missing from the table (None: KeyError)
        self.calls = []

    def __call__(self, tokens, rows, group=1, every_row=False, host_rows=None):
        assert host_rows is None or host_rows == rows[::group].tolist()  # the same rows on the host
        self.calls.append((tokens.tolist(), rows.tolist()))
        missing = [] if self.default is None else _logits(self.default)
        return torch.stack([self.table.get(tuple(t), missing) if self.default is not None
                            else self.table[tuple(t)] for t in tokens.tolist()])


def _input(step_rows, tokens, variants, step=0):
    """StepInput for hand-built logits: step_rows [B][W] of (p, tok), tokens [B][W] (M = masked)."""
    logits = torch.stack([_logits(r) for r in step_rows])  # [B, W, V]
    return step_input(logits, tokens=tokens, forward_variants=variants, step=step)


ANY = [(0.99, 0)] * 5  # logits of positions a test does not read (committed or non-mask)

# row 0: five masks; p = 0.95 at 0 (the anchor), then 2 (0.8) and 1 (0.6) are the best candidates
# row 1: two masks left (3: 0.5, 4: 0.4): anchor 3, one candidate (4), the third variant is a duplicate
# row 2: no masks: left out of the variant forward
STEP = [
    [(0.95, 1), (0.6, 2), (0.8, 3), (0.5, 4), (0.3, 5)],
    [(0.99, 1), (0.99, 2), (0.99, 3), (0.5, 4), (0.4, 5)],
    ANY,
]
TOKENS = [[M, M, M, M, M], [1, 2, 3, M, M], [1, 2, 3, 4, 5]]
R0_B0, R0_B1, R0_B2 = (1, M, M, M, M), (1, M, 3, M, M), (1, 2, M, M, M)
R1_B0, R1_B1 = (1, 2, 3, 4, M), (1, 2, 3, 4, 5)


def _table(b0_pos2_token=3):
    return {
        # B0': every remaining mask at 0.5, its arg-max agreeing with the variant tokens (2 at 1, 3 at 2)
        R0_B0: [(0.99, 1), (0.5, 2), (0.5, b0_pos2_token), (0.5, 4), (0.5, 5)],
        # variant 1 (2 <- 3): confident lookahead, 1 and 3 pass tau = 0.9 (the bonus), 4 does not
        R0_B1: [(0.99, 1), (0.97, 2), (0.99, 3), (0.92, 6), (0.5, 5)],
        # variant 2 (1 <- 2): medium
        R0_B2: [(0.99, 1), (0.99, 2), (0.7, 8), (0.6, 4), (0.5, 5)],
        R1_B0: [(0.99, 1), (0.99, 2), (0.99, 3), (0.99, 4), (0.5, 5)],
        R1_B1: ANY,
    }


@pytest.mark.parametrize("compact", [False, True])
def test_variants_winner_and_bonus_on_hand_built_logits(compact):
    row2 = tuple(TOKENS[2])
    stub = StubVariants({**_table(), row2: ANY})
    out = make_sampler("lopa", branches=3, compact=compact).step(_input(STEP, TOKENS, stub), None)
    # one batched forward: 3 canvases per row (row 1's third a duplicate of B0'); row 2, without
    # masks, forwards its canvas 3 times with compact=False (static shapes) and is left out by default
    assert len(stub.calls) == 1
    canvases, rows = stub.calls[0]
    expected = [list(R0_B0), list(R0_B1), list(R0_B2), list(R1_B0), list(R1_B1), list(R1_B0)]
    if compact:
        assert rows == [0, 0, 0, 1, 1, 1] and canvases == expected
    else:
        assert rows == [0, 0, 0, 1, 1, 1, 2, 2, 2] and canvases == expected + [list(row2)] * 3
    # row 0: variant 1 wins; its fills (0, 2) + the bonus from its own logits (1 -> 2, 3 -> 6)
    assert out.commit[0].tolist() == [True, True, True, True, False]
    assert out.tokens[0, :4].tolist() == [1, 2, 3, 6]
    # row 1: variant 1 fills the block's last mask: score +inf, wins
    assert out.commit[1].tolist() == [False, False, False, True, True]
    assert out.tokens[1, 3:].tolist() == [4, 5]
    assert not out.commit[2].any()


def test_a_variant_whose_token_b0_no_longer_proposes_cannot_win():
    # B0's logits now put 7 at position 2, where variant 1 wrote 3: variant 1 is out, variant 2 wins
    # (its 0.7/0.6/0.5 beat B0's 0.5s) and its bonus is its own top-1 (2 -> 8)
    stub = StubVariants(_table(b0_pos2_token=7))
    out = make_sampler("lopa", branches=3).step(_input(STEP, TOKENS, stub), None)
    assert out.commit[0].tolist() == [True, True, True, False, False]
    assert out.tokens[0, :3].tolist() == [1, 2, 8]
    # the paper's selection (no guard) takes variant 1 anyway
    paper = make_sampler("lopa", branches=3, verify_variants=False)
    out = paper.step(_input(STEP, TOKENS, StubVariants(_table(b0_pos2_token=7))), None)
    assert out.commit[0].tolist() == [True, True, True, True, False]
    assert out.tokens[0, :4].tolist() == [1, 2, 3, 6]


def test_bonus_off_commits_the_winner_only():
    sampler = make_sampler("lopa", branches=3, bonus=False)
    out = sampler.step(_input(STEP, TOKENS, StubVariants(_table())), None)
    assert out.commit[0].tolist() == [True, False, True, False, False]
    assert out.tokens[0, [0, 2]].tolist() == [1, 3]


@pytest.mark.parametrize("kind", ["negative_entropy", "max_prob"])
def test_ties_go_to_the_anchor_variant(kind):
    # both variants see 0.6 at every remaining mask: equal means -> variant 0 (B0') wins
    step = [[(0.5, 1), (0.4, 2), (0.3, 3)]]
    same = [(0.99, 1), (0.6, 2), (0.6, 3)]
    table = {(1, M, M): same, (1, 2, M): same}
    out = make_sampler("lopa", branches=2, confidence=kind, bonus=False).step(
        _input(step, [[M, M, M]], StubVariants(table)), None)
    assert out.commit[0].tolist() == [True, False, False]
    # with the bonus, B0's own top-1 (the first of the tied 0.6s) follows; variant 1 would add 2 too
    sampler = make_sampler("lopa", branches=2, confidence=kind)
    out = sampler.step(_input(step, [[M, M, M]], StubVariants(table)), None)
    assert out.commit[0].tolist() == [True, True, False] and out.tokens[0, :2].tolist() == [1, 2]


def test_compact_clamps_the_variant_count_and_skips_when_the_anchor_finishes():
    stub = StubVariants(_table(), default=[(0.5, 0)] * 5)
    make_sampler("lopa", branches=8, compact=True).step(_input(STEP[:1], TOKENS[:1], stub), None)
    assert len(stub.calls[0][0]) == 5  # B0' + the 4 masks it left, not 8
    confident = [[(0.95, 1), (0.92, 2), (0.99, 3)]]

    def never(tokens, rows, group=1):
        raise AssertionError("no variant forward when the anchor fills the whole block")

    out = make_sampler("lopa", compact=True).step(_input(confident, [[M, M, M]], never), None)
    assert out.commit[0].all() and out.tokens[0].tolist() == [1, 2, 3]


def test_static_variant_batch_reads_nothing_back():
    # compact=False: branches variants per row (at most 1 + W), whatever the candidates, and the variant
    # forward even when the anchor fills the block (its B0' then wins and commits the anchor)
    stub = StubVariants(_table(), default=[(0.5, 0)] * 5)
    make_sampler("lopa", branches=8, compact=False).step(_input(STEP[:1], TOKENS[:1], stub), None)
    assert len(stub.calls[0][0]) == 1 + 5  # B0' + one per block column, not 8
    confident = [[(0.95, 1), (0.92, 2), (0.99, 3)]]
    stub = StubVariants({}, default=[(0.5, 0)] * 3)
    out = make_sampler("lopa", compact=False).step(_input(confident, [[M, M, M]], stub), None)
    assert len(stub.calls) == 1 and stub.calls[0][0] == [[1, 2, 3]] * 4
    assert out.commit[0].all() and out.tokens[0].tolist() == [1, 2, 3]


def test_block_mode_skips_the_variant_forward_only_where_its_first_step_fills_every_block():
    # compact="block": static shapes, and at a block's first step (step 0) the anchor's fill is read
    confident = [[(0.95, 1), (0.92, 2), (0.99, 3)]]

    def never(tokens, rows, group=1):
        raise AssertionError("no variant forward when the anchor fills every block at the first step")

    out = make_sampler("lopa", compact="block").step(_input(confident, [[M, M, M]], never), None)
    assert out.commit[0].all() and out.tokens[0].tolist() == [1, 2, 3] and out.next_logits is None
    stub = StubVariants({}, default=[(0.5, 0)] * 3)  # a later step reads nothing: the static batch runs
    make_sampler("lopa", compact="block").step(_input(confident, [[M, M, M]], stub, step=1), None)
    assert len(stub.calls) == 1 and stub.calls[0][0] == [[1, 2, 3]] * 4
    stub = StubVariants(_table(), default=[(0.5, 0)] * 5)  # masks left at the first step: the static batch
    make_sampler("lopa", branches=8, compact="block").step(_input(STEP[:1], TOKENS[:1], stub), None)
    assert len(stub.calls[0][0]) == 1 + 5


# ---- end to end on tiny models -----------------------------------------------------------------------
PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


def _counted(model):
    """Wrap the model's forward to record every forward's [rows, width]."""
    shapes = []
    inner = model.forward

    def forward(input_ids, *args, **kwargs):
        shapes.append(tuple(input_ids.shape))
        return inner(input_ids, *args, **kwargs)

    model.forward = forward
    return shapes


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_ragged_batch_decodes_as_alone_and_counts_every_forward(family):
    model = tiny(family, seed=3)
    shapes = _counted(model)
    per_step = []
    out = dllm.generate(model, PROMPTS, sampler="lopa", gen_length=12, block_length=4,
                        callback=lambda s: per_step.append(len(shapes)))
    assert (out.generated != model.mask_id).all()
    width = 5 + 12
    # accounting: every forward counted once, forwarded tokens = rows x canvas length
    assert out.nfe == len(shapes) and out.forwarded_tokens == sum(r * t for r, t in shapes)
    assert all(t == width for _, t in shapes)
    assert out.steps < out.nfe <= 2 * out.steps
    starts = [0] + per_step[:-1]
    for a, b in zip(starts, per_step):  # each step: its forward of the batch, then <= 1 variant forward
        assert shapes[a][0] == 3 and b - a in (1, 2)
        if b - a == 2:
            assert shapes[a + 1][0] <= 3 * 4  # live rows x variants <= (1 + k - 1) canvases per row
    for j, p in enumerate(PROMPTS):
        alone = dllm.generate(model, [p], sampler="lopa", gen_length=12, block_length=4)
        assert torch.equal(out.generated[j], alone.generated[0]), j


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("reuse", [False, True])
def test_static_shapes_decode_the_same_tokens(family, cache, reuse):
    # compact=False forwards every row's variants, duplicates included: the same winners, more forwards
    model = tiny(family, seed=3)
    kw = dict(sampler="lopa", gen_length=12, block_length=4, cache=cache, reuse=reuse, branches=3)
    ref = dllm.generate(model, PROMPTS, compact=True, **kw)
    out = dllm.generate(model, PROMPTS, compact=False, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert out.nfe >= ref.nfe and out.forwarded_tokens >= ref.forwarded_tokens
    block = dllm.generate(model, PROMPTS, compact="block", **kw)  # static shapes, the first steps read
    assert torch.equal(block.sequences, ref.sequences)
    assert ref.nfe <= block.nfe <= out.nfe and block.forwarded_tokens <= out.forwarded_tokens


def test_block_mode_saves_the_forwards_of_blocks_its_first_step_fills():
    # tau_conf 0.05: the anchor takes nearly every mask at a block's first step, so most blocks end there
    model = tiny("llada", seed=3)
    kw = dict(sampler="fast", gen_length=12, block_length=4, cache="dual", tau_conf=0.05)
    static = dllm.generate(model, PROMPTS, compact=False, **kw)
    counter = count_generate(model, PROMPTS, compact="block", **kw)
    block = dllm.generate(model, PROMPTS, compact="block", **kw)
    assert torch.equal(block.sequences, static.sequences)
    assert block.nfe < static.nfe
    reads = [[site for site in step.syncs if "dllm/samplers/lopa.py" in site] for step in counter.steps]
    assert all(len(r) <= 1 for r in reads) and 0 < sum(map(len, reads)) <= 12 // 4  # one per block at most


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_one_variant_with_the_bonus_is_threshold_decoding(family):
    # variant 0 alone (branches=1): each step is two threshold steps (the step's forward, then B0's forward)
    model = tiny(family, seed=3)
    ref = dllm.generate(model, PROMPTS, sampler="threshold", gen_length=12, block_length=4)
    out = dllm.generate(model, PROMPTS, sampler="lopa", gen_length=12, block_length=4, branches=1)
    assert torch.equal(out.sequences, ref.sequences) and out.nfe == ref.nfe


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_counts_the_variant_forward_exactly(family):
    # one row, one block of 6, k = 2, nothing reaches tau = 1: a step commits the anchor's top-1,
    # maybe the variant token, and the bonus top-1. A step that leaves masks after the anchor pays
    # a second forward of 1 + 1 canvases; the others pay only their own forward. L = 3 + 6.
    model = tiny(family, seed=3)
    out = dllm.generate(model, [[7, 8, 9]], sampler="lopa", gen_length=6, branches=2, tau_conf=1.0,
                        return_trace=True)
    variant_forwards = out.nfe - out.steps
    assert 1 <= variant_forwards <= out.steps
    assert out.forwarded_tokens == 9 * (out.steps + 2 * variant_forwards)
    per_step = torch.bincount(out.trace[0], minlength=out.steps)
    assert (per_step >= 1).all() and out.steps <= 3  # >= 2 tokens per step while 2 masks remain


# ---- the exact-posterior oracle ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def oracle():
    return OracleLM()


def test_copy_is_solved_in_fewer_forwards_than_tokens(oracle):
    exs = T.test_split("copy", 8, 6)
    g = T.answer_length("copy", 8)  # 9: eight words and the EOS
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="lopa", gen_length=g, block_length=4, compact=True)
    assert all(score_generation(exs, out))
    assert out.nfe == 3 < g  # p = 1 everywhere: the anchor fills each block, no variant forward
    static = dllm.generate(oracle, oracle_prompts(exs), sampler="lopa", gen_length=g, block_length=4, compact=False)
    assert torch.equal(static.sequences, out.sequences)
    assert static.nfe == 6  # without the host read each block's step also forwards its variants


def test_shuffle_stays_valid_and_the_guard_is_what_keeps_it(oracle):
    # shuffle of 4 (four item slots tied at 1/4, the EOS slot at 1), T = 0, exact marginals
    exs = T.test_split("shuffle", 4, 8)
    g = T.answer_length("shuffle", 4)  # 5
    out = dllm.generate(oracle, oracle_prompts(exs), sampler="lopa", gen_length=g)
    assert all(score_generation(exs, out))  # 100%
    assert out.steps == 2 and out.nfe == 4 < g
    # without the guard the last tied pair is one variant that finishes the block (+inf): both
    # slots take the same item (the paper's selection), so no row is a permutation
    paper = dllm.generate(oracle, oracle_prompts(exs), sampler="lopa", gen_length=g, verify_variants=False)
    assert not any(score_generation(exs, paper))


def test_shuffle_with_a_noisy_oracle(oracle):
    # ParallelBench's unbiased model (i.i.d. logit noise breaks the ties per position)
    exs = T.test_split("shuffle", 4, 40)
    g = T.answer_length("shuffle", 4)
    prompts = oracle_prompts(exs)
    guarded = dllm.generate(OracleLM(noise_std=0.5, seed=0), prompts, sampler="lopa", gen_length=g)
    paper = dllm.generate(OracleLM(noise_std=0.5, seed=0), prompts, sampler="lopa", gen_length=g,
                          verify_variants=False)
    assert all(score_generation(exs, guarded))
    assert sum(score_generation(exs, paper)) < len(exs)  # 17 / 40 when written


# ---- options and refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize("options,match", [
    (dict(branches=0), r"branches must be an integer >= 1 \(variant 0 is the anchor itself\), got 0"),
    (dict(branches=-2), r"branches must be an integer >= 1 .*got -2"),
    (dict(branches=2.5), r"branches must be an integer >= 1 .*got 2.5"),
    (dict(branches=True), r"branches must be an integer >= 1 .*got True"),
    (dict(tau_conf=0.0), r"tau_conf must be a number in \(0, 1\], got 0.0"),
    (dict(tau_conf=1.5), r"tau_conf must be a number in \(0, 1\], got 1.5"),
    (dict(confidence="entropy"), r"confidence must be one of 'negative_entropy', 'max_prob', got 'entropy'"),
    (dict(bonus="yes"), r"bonus must be True or False, got 'yes'"),
    (dict(reuse=1), r"reuse must be True or False, got 1"),
    (dict(compact="yes"), r"compact must be True, False, \"block\" .* or \"auto\" .*got 'yes'"),
])
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler("lopa", **options)


def test_unknown_option_lists_the_valid_ones():
    valid = "Valid options: branches, tau_conf, confidence, bonus, verify_variants, reuse"
    with pytest.raises(TypeError, match=valid):
        make_sampler("lopa", draft=3)


def test_engine_refusals():
    model = tiny("llada", seed=3)
    with pytest.raises(ValueError, match="cache policy 'dual' cannot serve with these options: refresh=1 .*drop refresh"):
        dllm.generate(model, [[7, 8]], sampler="lopa", gen_length=4, cache="dual:refresh=1")
    with pytest.raises(ValueError, match="greedy only"):
        dllm.generate(model, [[7, 8]], sampler="lopa", gen_length=4, temperature=1.0)

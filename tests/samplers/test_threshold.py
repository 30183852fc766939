"""Fast-dLLM's threshold and factor rules: hand-built logits and end-to-end progress."""

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.samplers import make_sampler
from dllm.samplers._ops import propose_with_confidence, ranks_of
from dllm.samplers.threshold import factor_prefix, factor_prefix_mask
from dllm.state import StepInput

MASK, V = 9, 10


def _input(probs_rows, active=None):
    probs = torch.tensor(probs_rows, dtype=torch.float64)  # [W, V]
    logits = torch.log(probs).float()[None]  # [1, W, V]
    width = logits.shape[1]
    active = torch.ones(1, width, dtype=torch.bool) if active is None else torch.tensor([active])
    return StepInput(logits=logits, tokens=torch.full((1, width), MASK), active=active, query_start=0,
                     window=(0, width), step=0, steps=None, mask_id=MASK, temperature=0.0, generator=None)


def _row(p_top, tok):
    row = [(1 - p_top) / (V - 1)] * V
    row[tok] = p_top
    return row


def test_threshold_commits_confident_masks_only():
    inp = _input([_row(0.95, 1), _row(0.5, 2), _row(0.91, 3), _row(0.89, 4)])
    out = make_sampler("threshold", threshold=0.9).step(inp, None)
    assert out.commit[0].tolist() == [True, False, True, False]
    assert out.tokens[0].tolist() == [1, 2, 3, 4]


def test_threshold_is_inclusive_and_respects_active():
    inp = _input([_row(0.9, 1), _row(0.99, 2)], active=[True, False])
    out = make_sampler("threshold", threshold=0.9).step(inp, None)
    assert out.commit[0].tolist() == [True, False]


@pytest.mark.parametrize("conf,f,n", [
    ([0.99, 0.8, 0.7], 1.0, 2),  # k=2: 3*0.2=0.6 ok; k=3: 4*0.3=1.2 > 1 stop
    ([0.99, 0.5, 0.99], 1.0, 1),  # k=2 fails: the later confident one is not reached
    ([0.99, 0.9, 0.9, 0.9], 1.0, 4),
    ([0.1, 0.1], 1.0, 1),  # top-1 always
    ([0.99, 0.8, 0.7], 1.3, 3),
])
def test_factor_prefix(conf, f, n):
    assert factor_prefix(torch.tensor([conf], dtype=torch.float64), f).tolist() == [n]


@pytest.mark.parametrize("f", [0.01, 0.5, 1.0, 4.0])
def test_factor_prefix_mask_is_the_prefix_of_the_rule_as_written(f):
    g = torch.Generator().manual_seed(3)
    conf = torch.rand(64, 9, generator=g, dtype=torch.float64)
    conf[::3] = conf[::3].round(decimals=1)  # ties
    conf[::4, 5:] = float("-inf")  # fewer active masks than positions
    conf[7] = float("-inf")  # none
    conf_sorted = conf.sort(dim=1, descending=True).values
    mask = factor_prefix_mask(conf_sorted, f)  # [B, N]
    n = factor_prefix(conf_sorted, f)  # [B]
    assert torch.equal(mask, torch.arange(9)[None] < n[:, None])


@pytest.mark.parametrize("f", [0.01, 1.0, 4.0])
def test_factor_step_commits_what_the_rule_as_written_commits(f):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 8, V, generator=g) * 3
    logits[::2, :, 1] = 4.0  # equal confidences
    active = torch.rand(16, 8, generator=g) < 0.7
    inp = StepInput(logits=logits, tokens=torch.full((16, 8), MASK), active=active, query_start=0, window=(0, 8),
                    step=0, steps=None, mask_id=MASK, temperature=0.0, generator=None)
    out = make_sampler("factor", factor=f).step(inp, None)
    tokens, conf = propose_with_confidence(inp)
    conf = conf.masked_fill(~active, float("-inf"))
    sorted_conf, order = conf.sort(dim=1, descending=True, stable=True)
    literal = active & (ranks_of(order) < factor_prefix(sorted_conf, f)[:, None])
    assert torch.equal(out.commit, literal) and torch.equal(out.tokens, tokens)


def test_factor_commits_the_prefix_in_confidence_order():
    inp = _input([_row(0.7, 1), _row(0.99, 2), _row(0.8, 3)])
    out = make_sampler("factor", factor=1.0).step(inp, None)
    assert out.commit[0].tolist() == [False, True, True]


@pytest.mark.parametrize("name,options,match", [
    ("threshold", dict(threshold=0.0), r"threshold must be (a number )?in \(0, 1\], got 0.0"),
    ("threshold", dict(threshold=1.5), r"threshold must be (a number )?in \(0, 1\], got 1.5"),
    ("factor", dict(factor=0.0), r"factor must be (a number )?> 0, got 0.0"),
    ("factor", dict(factor=-1.0), r"factor must be (a number )?> 0, got -1.0"),
])
def test_out_of_range(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_sampler(name, **options)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("name,options", [("threshold", dict(threshold=1.0)), ("threshold", {}), ("factor", {})])
def test_adaptive_decoding_finishes_and_threshold_one_is_one_token_per_step(family, name, options):
    model = tiny(family, seed=1)
    out = dllm.generate(model, [[5, 6, 7], [8, 9]], sampler=name, gen_length=8, block_length=4,
                        return_trace=True, **options)
    assert (out.generated != model.mask_id).all()
    assert out.nfe <= 8
    if options.get("threshold") == 1.0:  # nothing reaches p = 1: exactly the forced top-1 per step
        assert out.nfe == 8
        ref = dllm.generate(model, [[5, 6, 7], [8, 9]], sampler="low_confidence", gen_length=8, block_length=4)
        assert torch.equal(out.sequences, ref.sequences)


# ---- the step cap of Fast-dLLM's Dream confidence_threshold (schedule_steps) -------------------------
def test_later_quotas():
    from dllm.samplers.threshold import later_quotas

    # quotas of 10 masks over 4 steps: 3, 3, 2, 2 -> left for later steps: 7, 4, 2, 0
    assert later_quotas(torch.tensor([10, 8]), 4).tolist() == [[7, 4, 2, 0], [6, 4, 2, 0]]


def test_the_cap_takes_the_most_confident_of_the_confident_and_carries_the_rest():
    from types import SimpleNamespace

    rows = [_row(0.95, 1), _row(0.5, 2), _row(0.97, 3), _row(0.92, 4)]
    for ties in ("reference", "first"):
        sampler = make_sampler("threshold", threshold=0.9, schedule_steps=2, ties=ties)  # quotas 2, 2
        state = SimpleNamespace(extras={}, block_masks_at_start=torch.tensor([4]), x=torch.zeros(1, 6), block_start=2,
                                block_end=6)
        sampler.begin_block(state)
        inp = _input(rows)
        assert sampler.step(inp, state).commit[0].tolist() == [True, False, True, False], ties  # cap 4 - 2 = 2
        inp.step = 1  # the last scheduled step: no cap, the plain threshold rule
        assert sampler.step(inp, state).commit[0].tolist() == [True, False, True, True], ties
    assert make_sampler("threshold", threshold=0.9).step(_input(rows), state).commit[0].tolist() == [
        True, False, True, True]


def _fastdllm_dream_pairs(model, gen, steps, tau, cap=True, **options):
    """(dllm output, reference canvas, reference NFE) over 20 prompts, skipping the ones where the
    reference commits the mask id."""
    import pathlib
    import sys

    from tests.reference.decoders.fastdllm_dream_generate import fastdllm_dream_threshold_generate
    from tests.reference.decoders.llada_generate import MaskCommitError

    special = {model.mask_id, model.eos_id, model.eot_id, model.pad_id, model.bos_id}
    pool = torch.tensor([t for t in range(model.config.vocab_size) if t not in special])
    pairs = []
    for seed in range(20):
        prompt = pool[torch.randint(len(pool), (1, 6), generator=torch.Generator().manual_seed(10_000 + seed))]
        try:
            ref, nfe = fastdllm_dream_threshold_generate(
                lambda x, am, pos: model.raw_logits(x, positions=pos), prompt, max_new_tokens=gen,
                steps=steps, threshold=tau, mask_id=model.mask_id, forbid_mask_commit=True)
        except MaskCommitError:
            continue
        capped = {"schedule_steps": steps, **options} if cap else {}
        out = dllm.generate(model, prompt, sampler="threshold", gen_length=gen, threshold=tau, **capped)
        pairs.append((out, ref, nfe))
    assert len(pairs) >= 15
    return pairs


@pytest.mark.parametrize("family_model,gen,steps,tau", [
    ("random", 16, 4, 0.5), ("random", 32, 8, 0.3), ("random", 16, 2, 0.3), ("random", 16, 16, 0.5),
    pytest.param("trained", 16, 8, 0.9, marks=pytest.mark.slow),
    pytest.param("trained", 16, 4, 0.9, marks=pytest.mark.slow),
])
def test_schedule_steps_reproduces_fastdllm_dream_confidence_threshold(family_model, gen, steps, tau):
    """Token for token and NFE for NFE against the transcription of Fast-dLLM's Dream decoder, one
    block of the whole generation, steps < gen length. Without the cap, 0 of 20 prompts matched on
    the random model at these thresholds, and 16-19 of 20 on tiny-dream at 0.9."""
    model = tiny("dream", seed=0) if family_model == "random" else dllm.load("tiny-dream", dtype=torch.float32)
    for out, ref, nfe in _fastdllm_dream_pairs(model, gen, steps, tau):
        assert torch.equal(out.sequences, ref) and out.nfe == nfe


def test_without_the_cap_threshold_differs_from_fastdllm_dream():
    """The cap is what makes the difference (the comparison above is not vacuous)."""
    pairs = _fastdllm_dream_pairs(tiny("dream", seed=0), 16, 4, 0.5, cap=False)
    assert sum(torch.equal(out.sequences, ref) for out, ref, _ in pairs) < len(pairs) // 2


def _saturated_dream():
    """The random tiny Dream with its LM head x100: float32 softmaxes saturate at exactly 1.0, so
    many masks tie at the cap."""
    model = tiny("dream", seed=0)
    with torch.no_grad():
        model.transformer.lm_head.weight.mul_(100)
    return model


@pytest.mark.parametrize("gen,steps,tau", [(16, 4, 0.9), (32, 8, 0.3)])
def test_schedule_steps_reproduces_fastdllm_dream_when_confidences_saturate(gen, steps, tau):
    """Saturated confidences (logits x100): the capped set is Fast-dLLM's ``torch.topk`` over the
    canvas of logits-dtype confidences (``ties=reference``, the default), token for token and NFE
    for NFE on 20 prompts at S = 4 and S = 8."""
    model = _saturated_dream()
    pairs = _fastdllm_dream_pairs(model, gen, steps, tau)
    canvas = pairs[0][0].sequences.clone()
    canvas[:, 6:] = model.mask_id  # the first step's canvas
    top = torch.softmax(model.raw_logits(canvas), dim=-1).max(dim=-1).values  # float32
    assert (top == 1.0).float().mean() > 0.5  # the setting really saturates
    for out, ref, nfe in pairs:
        assert torch.equal(out.sequences, ref) and out.nfe == nfe


def test_saturated_ties_taken_lowest_index_first_differ_from_fastdllm_dream():
    """``ties=first`` (lowest index among equal confidences, float64) is what the option changes:
    on the saturated model it differs from the reference on most prompts (20 of 20 when written)."""
    pairs = _fastdllm_dream_pairs(_saturated_dream(), 16, 4, 0.5, ties="first")
    assert sum(torch.equal(out.sequences, ref) and out.nfe == nfe for out, ref, nfe in pairs) < len(pairs) // 2


def test_ties_must_be_a_known_choice():
    with pytest.raises(ValueError, match=r"ties must be one of 'reference', 'first', got 'lowest'"):
        make_sampler("threshold", schedule_steps=4, ties="lowest")


@pytest.mark.parametrize("steps", [0, 2.0, True])
def test_schedule_steps_out_of_range(steps):
    with pytest.raises(ValueError, match=r"schedule_steps must be an integer >= 1 \(or None\), got"):
        make_sampler("threshold", schedule_steps=steps)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("schedule_steps", [2, 6])  # 6 > block length 4: quotas of 0 at the end
@pytest.mark.parametrize("ties", ["reference", "first"])
def test_schedule_steps_with_blocks_batches_and_caches(cache, schedule_steps, ties):
    model = tiny("llada", seed=1)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    kw = dict(sampler="threshold", threshold=0.3, schedule_steps=schedule_steps, gen_length=8,
              block_length=4, cache=cache, ties=ties)
    batch = dllm.generate(model, prompts, return_trace=True, **kw)
    assert (batch.generated != model.mask_id).all()
    for j, p in enumerate(prompts):
        assert torch.equal(batch.generated[j], dllm.generate(model, [p], **kw).generated[0]), j
    # with quota 2 per step (4 masks, 2 steps) no row commits more than 2 at the block's first step
    if schedule_steps == 2:
        assert ((batch.trace[:, :4] == 0).sum(dim=1) <= 2).all()


def test_the_fast_dllm_alias_is_gone():
    # it read like ``fast`` (a spec_threshold preset); the error lists the valid names
    with pytest.raises(ValueError, match=r"Unknown sampler 'fast_dllm'. Valid samplers: .*\bthreshold\b"):
        make_sampler("fast_dllm")

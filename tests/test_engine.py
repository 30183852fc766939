"""The decode engine on tiny random models of both families."""

import pytest
import torch

import dllm
from dllm.models import tiny
from dllm.samplers.base import NoOptions, Sampler
from dllm.state import StepOutput

FAMILIES = ("llada", "dream")


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny(request.param, seed=0)


def _ids(model, n, offset=0):
    """n ordinary token ids (no special ids)."""
    special = {model.mask_id, model.eos_id, model.eot_id, model.pad_id, model.bos_id}
    pool = [t for t in range(model.config.vocab_size) if t not in special]
    return [pool[(offset + 7 * i) % len(pool)] for i in range(n)]


def test_output_shapes_counts_and_trace(model):
    out = dllm.generate(model, [_ids(model, 5)], gen_length=12, block_length=4, steps=6, return_trace=True)
    assert out.sequences.shape == (1, 17) and out.prompt_length == 5
    assert (out.generated != model.mask_id).all()
    assert out.nfe == 6 and out.steps == 6
    assert out.forwarded_tokens == 6 * 17
    assert out.generated_tokens == 12
    # two commits per step, block by block: steps 0-1 fill block 0, 2-3 block 1, 4-5 block 2
    assert sorted(out.trace[0].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert out.trace[0, :4].max() <= 1 and out.trace[0, 8:].min() >= 4
    assert out.sequences[0, :5].tolist() == _ids(model, 5)


# deterministic samplers only: `random` and `origin` draw noise whose shape depends on the batch,
# exactly as the references do, so their draws differ between a row alone and in a batch
@pytest.mark.parametrize("sampler", ["low_confidence", "maskgit_plus", "topk_margin", "entropy"])
def test_batch_with_padding_equals_each_prompt_alone(model, sampler):
    prompts = [_ids(model, 3, 1), _ids(model, 8, 2), _ids(model, 5, 3)]
    kw = dict(sampler=sampler, gen_length=8, block_length=4, steps=8)
    batch = dllm.generate(model, prompts, **kw)
    for j, p in enumerate(prompts):
        alone = dllm.generate(model, [p], **kw)
        assert torch.equal(batch.generated[j], alone.generated[0]), (sampler, j)


def test_seed_reproduces_a_sampled_decode_and_another_seed_changes_it(model):
    # the same seed gives the same tokens run twice; a different seed changes them
    p = [_ids(model, 6)]
    a = dllm.generate(model, p, gen_length=16, temperature=1.0, seed=3)
    b = dllm.generate(model, p, gen_length=16, temperature=1.0, seed=3)
    c = dllm.generate(model, p, gen_length=16, temperature=1.0, seed=4)
    assert torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.sequences, c.sequences)


def test_every_step_commits_at_least_one_position_per_row(model):
    out = dllm.generate(model, [_ids(model, 4), _ids(model, 6, 1)], gen_length=12, block_length=6,
                        return_trace=True)
    for row in out.trace:
        assert sorted(row.tolist()) == list(range(12))  # one token per step, each step used once


class _Lazy(Sampler):
    """Adaptive sampler that never chooses anything (to test the engine's progress rule)."""

    Config = NoOptions
    fixed_steps = False

    def step(self, inp, state):
        score = torch.arange(inp.tokens.shape[1], dtype=torch.float32).expand_as(inp.tokens)
        return StepOutput(commit=torch.zeros_like(inp.active), tokens=inp.tokens.clone().fill_(5),
                          score=-score)


def test_adaptive_sampler_that_commits_nothing_still_finishes(model):
    out = dllm.generate(model, [_ids(model, 3)], sampler=_Lazy(), gen_length=6, block_length=3,
                        return_trace=True)
    assert out.nfe == 6  # one forced commit per step, leftmost (best score) first
    assert out.trace[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert (out.generated == 5).all()


class _Hopeless(_Lazy):
    """Adaptive sampler that chooses nothing and scores every position -inf (a log-probability that
    underflowed, a banned proposal): the progress rule must still commit an active mask."""

    def step(self, inp, state):
        return StepOutput(commit=torch.zeros_like(inp.active), tokens=inp.tokens.clone().fill_(5),
                          score=torch.full(inp.tokens.shape, float("-inf")))


def test_progress_rule_takes_the_first_active_mask_when_every_score_is_minus_inf():
    from dllm.engine.progress import guarantee_progress, guarantee_progress_reference

    inf = float("inf")
    active = torch.tensor([[False, True, True], [True, True, False], [False, False, False], [False, False, True]])
    score = torch.tensor([[1.0, -inf, -inf], [-inf, -inf, 3.0], [1.0, 2.0, 3.0], [-inf, 2.0, -inf]])
    want = torch.tensor([[False, True, False], [True, False, False], [False, False, False], [False, False, True]])
    for active_only in (False, True):
        decision = StepOutput(commit=torch.zeros(4, 3, dtype=torch.bool), tokens=torch.zeros(4, 3, dtype=torch.long),
                              score=score, active_only=active_only)
        assert torch.equal(guarantee_progress(decision, active, last=False, adaptive=True), want)
        assert torch.equal(guarantee_progress_reference(decision, active, last=False, adaptive=True), want)


def test_adaptive_sampler_scoring_minus_inf_still_finishes(model):
    out = dllm.generate(model, [_ids(model, 3), _ids(model, 5, 1)], sampler=_Hopeless(), gen_length=6,
                        block_length=3, return_trace=True)
    assert out.nfe == 6  # one forced commit per step: the first mask of the block
    assert out.trace.tolist() == [[0, 1, 2, 3, 4, 5]] * 2
    assert (out.generated == 5).all()


def test_callback_sees_every_step(model):
    seen = []
    dllm.generate(model, [_ids(model, 3)], gen_length=8, steps=4,
                  callback=lambda st: seen.append((st.step, int((st.generated == st.mask_id).sum()))))
    assert seen == [(1, 6), (2, 4), (3, 2), (4, 0)]  # (steps done, masks left)


def test_cfg_runs_doubled_batch_and_changes_logits(model):
    p = [_ids(model, 6)]
    plain = dllm.generate(model, p, gen_length=8)
    guided = dllm.generate(model, p, gen_length=8, cfg_scale=2.0)
    assert guided.nfe == plain.nfe == 8
    assert guided.forwarded_tokens == 2 * plain.forwarded_tokens
    assert (guided.generated != model.mask_id).all()


def test_cfg_matches_manual_guidance_on_first_step(model):
    p = torch.tensor([_ids(model, 5)])
    grabbed = {}

    class Spy(Sampler):
        Config = NoOptions
        fixed_steps = True

        def step(self, inp, state):
            grabbed.setdefault("logits", inp.logits.clone())
            return StepOutput(commit=inp.active, tokens=inp.tokens.clone().fill_(5))

    dllm.generate(model, p, sampler=Spy(), gen_length=4, steps=1, cfg_scale=0.5)
    x = torch.cat([p, torch.full((1, 4), model.mask_id)], 1)
    u = x.clone()
    u[:, :5] = model.mask_id
    cond, un = model(x).logits, model(u).logits
    assert torch.allclose(grabbed["logits"], un + 1.5 * (cond - un), atol=1e-5)


def test_stop_at_eos_finishes_rows_early(model):
    # force EOS everywhere through a sampler that proposes EOS: one block suffices
    class Eos(Sampler):
        Config = NoOptions
        fixed_steps = True

        def step(self, inp, state):
            return StepOutput(commit=inp.active, tokens=inp.tokens.clone().fill_(model.eos_id))

    out = dllm.generate(model, [_ids(model, 3)], sampler=Eos(), gen_length=12, block_length=4,
                        stop_at_eos=True)
    assert out.nfe == 4  # 4 steps of the first block, then stopped
    assert (out.generated == model.eos_id).all()
    assert out.content_tokens == 0
    assert out.generated_tokens == 4  # the first block's, which steps committed; not the EOS fill of the rest


def test_texts_are_decoded_when_the_model_has_a_tokenizer(model):
    out = dllm.generate(model, "hello the answer is", gen_length=4)
    assert isinstance(out.texts, list) and len(out.texts) == 1 and isinstance(out.texts[0], str)


def test_prompt_forms_agree(model):
    ids = _ids(model, 4)
    a = dllm.generate(model, torch.tensor(ids), gen_length=4)
    b = dllm.generate(model, [ids], gen_length=4)
    c = dllm.generate(model, torch.tensor([ids]), gen_length=4)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(b.sequences, c.sequences)


# ---- bad input: each a clear error naming the value and what is valid ----

@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(sampler="nope"), KeyError, r"Unknown sampler 'nope'\. Valid samplers: .*low_confidence"),
    (dict(sampler="low_confidence", threshold=0.9), TypeError, r"Unknown option\(s\) 'threshold'.*Valid options"),
    (dict(gen_length=0), ValueError, r"gen_length must be a positive integer, got 0"),
    (dict(gen_length=8, block_length=0), ValueError, r"block_length must be a positive integer .*got 0"),
    (dict(gen_length=8, block_length=-1), ValueError, r"block_length .* got -1"),
    (dict(gen_length=8, block_length=4, steps=3), ValueError, r"steps=3 cannot be split evenly over 2 blocks"),
    (dict(gen_length=8, steps=9), ValueError, r"9 steps per block but a block holds only 8"),
    (dict(gen_length=8, temperature=-1.0), ValueError, r"temperature must be a finite number >= 0, got -1.0"),
    (dict(gen_length=8, cache="nope"), ValueError, r"Unknown cache policy 'nope'\. Valid cache policies: .*dual.*none"),
    (dict(gen_length=100000), ValueError, r"exceeds the model's \d+ positions"),
    (dict(gen_length=4, block_length=8), ValueError, r"block_length must be a positive integer <= gen_length=4 .*got 8"),
    (dict(gen_length=4, seed="abc"), ValueError, r"seed must be an integer in \[0, 2\*\*64 - 1\] .* got 'abc'"),
    (dict(gen_length=4, seed=1.5), ValueError, r"seed must be .* got 1.5"),
    (dict(gen_length=4, callback=5), TypeError, r"callback must be callable .* got int 5"),
    (dict(gen_length=4, sampler=3), TypeError, r"sampler must be a registered name, a spec string"),
    (dict(gen_length=4, sampler="threshold:threshold=1.5"), ValueError, r"threshold must be .*\(0, 1\].* got 1.5"),
    # seeds past torch.Generator's uint64 (a raw "Overflow when unpacking long long" before)
    (dict(gen_length=4, seed=2**70), ValueError,
     r"seed must be an integer in \[0, 2\*\*64 - 1\] \(torch.Generator's range\), .* got 1180591620717411303424"),
    (dict(gen_length=4, seed=2**64), ValueError, r"seed must be an integer in \[0, 2\*\*64 - 1\].* got 18446744073709551616"),
    (dict(gen_length=4, seed=-1), ValueError, r"seed must be .* got -1"),
    # flags are booleans: "no" is not read as true
    (dict(gen_length=4, stop_at_eos="no"), ValueError, r"stop_at_eos must be True or False, got 'no'"),
    (dict(gen_length=4, return_trace="no"), ValueError, r"return_trace must be True or False, got 'no'"),
    (dict(gen_length=4, chat="no"), ValueError, r"chat must be True or False, got 'no'"),
    (dict(gen_length=4, stop_at_eos=1), ValueError, r"stop_at_eos must be True or False, got 1"),
    # one option given twice: an error naming both values, not "the keyword wins"
    (dict(gen_length=4, sampler="threshold:threshold=0.8", threshold=0.9), ValueError,
     r"sampler option\(s\) given twice \('threshold': 0.8 in the spec 'threshold:threshold=0.8' and 0.9 as a keyword\)"),
    (dict(gen_length=4, sampler={"name": "threshold", "threshold": 0.8}, threshold=0.9), ValueError,
     r"given twice \('threshold': 0.8 in the mapping .* and 0.9 as a keyword\)"),
    (dict(gen_length=4, cache="dual:refresh=4", refresh=2), ValueError,
     r"'refresh' is an option of cache policy 'dual', not of the sampler: cache='dual:refresh=4' already sets "
     r"refresh=4; give it once, in the cache spec"),
    (dict(gen_length=4, cache="dual", refresh=2), ValueError,
     r"Unknown option\(s\) 'refresh' for sampler 'low_confidence'.*'refresh' is an option of cache policy 'dual'.*"
     r"give it in the cache spec: cache='dual:refresh=2'"),
])
def test_bad_settings(model, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        dllm.generate(model, [_ids(model, 4)], **kwargs)


def test_the_largest_seed_runs_and_reproduces(model):
    kw = dict(sampler="low_confidence", gen_length=4, temperature=1.0, seed=2**64 - 1)
    a = dllm.generate(model, [_ids(model, 4)], **kw)
    assert torch.equal(a.sequences, dllm.generate(model, [_ids(model, 4)], **kw).sequences)


def test_model_none_is_a_clear_error():
    with pytest.raises(TypeError, match=r"model must be a dllm DiffusionLM \(from dllm.load\(name_or_path\)\), got NoneType"):
        dllm.generate(None, [[5, 6]], gen_length=4)


def test_sampler_spec_string_equals_keyword_options(model):
    """One spec grammar: ``sampler="threshold:threshold=0.5"`` is ``sampler="threshold", threshold=0.5``
    (and a spec with another value decodes differently, so the spec is really read)."""
    ids = [_ids(model, 4)]
    spec = dllm.generate(model, ids, sampler="threshold:threshold=0.5", gen_length=8)
    kw = dllm.generate(model, ids, sampler="threshold", threshold=0.5, gen_length=8)
    mapping = dllm.generate(model, ids, sampler={"name": "threshold", "threshold": 0.5}, gen_length=8)
    assert torch.equal(spec.sequences, kw.sequences) and spec.nfe == kw.nfe
    assert torch.equal(spec.sequences, mapping.sequences) and spec.nfe == mapping.nfe
    loose = dllm.generate(model, ids, sampler="threshold:threshold=1e-9", gen_length=8)
    assert loose.nfe == 1 and spec.nfe > 1  # the spec's value is what decides


def test_prompt_with_mask_token_is_rejected(model):
    with pytest.raises(ValueError, match=rf"prompt 0 contains the mask token \(id {model.mask_id}\) at position 2"):
        dllm.generate(model, [[5, 6, model.mask_id]], gen_length=4)


@pytest.mark.parametrize("prompt", ["", [[]], "   "])
def test_empty_prompt_is_rejected(model, prompt):
    with pytest.raises(ValueError, match="empty"):
        dllm.generate(model, prompt, gen_length=4)


def test_out_of_vocabulary_ids_are_rejected(model):
    with pytest.raises(ValueError, match=r"token ids outside \[0, \d+\)"):
        dllm.generate(model, [[5, 10**7]], gen_length=4)


def test_sampler_instance_with_options_is_rejected(model):
    from dllm.samplers import make_sampler

    with pytest.raises(TypeError, match="together with a sampler instance"):
        dllm.generate(model, [_ids(model, 3)], sampler=make_sampler("random"), gen_length=4,
                      logits_eos_inf=True)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual", "window"])
@pytest.mark.parametrize("sampler", ["prophet", "threshold"])
def test_stop_at_eos_batch_equals_each_row_alone(sampler, cache):
    """A row whose answer ended stops alone: with an all-in sampler (Prophet) under a windowed cache,
    row 0 (copy, size 3) commits its EOS past the block together with everything before it; it
    used to keep decoding in the batch (tokens after its EOS) although alone it stopped."""
    from dllm import tasks as T
    from dllm.models import load

    m = load("tiny-llada")
    prompts = [T.prompt_ids(T.test_split("copy", 3, n=1)[0]), T.prompt_ids(T.test_split("shuffle", 8, n=1)[0])]
    kw = dict(sampler=sampler, cache=cache, gen_length=12, block_length=4, stop_at_eos=True)
    both = dllm.generate(m, prompts, **kw)
    for j, p in enumerate(prompts):
        alone = dllm.generate(m, [p], **kw)
        assert both.generated[j].tolist() == alone.generated[0].tolist(), (j, both.generated[j], alone.generated[0])
        assert both.texts[j] == alone.texts[0]
    eos = m.eos_ids[0]
    row0 = both.generated[0].tolist()
    assert eos in row0 and all(t == eos for t in row0[row0.index(eos):])  # nothing after its EOS


@pytest.mark.parametrize("kw", [dict(sampler="low_confidence:k=2"), dict(k=2)])
def test_k_is_refused_with_a_pointer_to_steps(kw):
    """compare and stress take k (tokens per step); generate says how to ask for it."""
    from dllm.models.tiny import tiny

    with pytest.raises(TypeError, match=r"Unknown option.*'k'.*steps = gen_length / k.*--steps"):
        dllm.generate(tiny("llada"), [[5, 6, 7]], gen_length=4, **kw)


def test_progress_rule_equals_its_reference():
    """The engine's progress rule in few calls commits what the rule as written commits: random
    commits, active maps (rows without masks included), scores with ties, NaN and -inf, or none."""
    from dllm.engine.progress import guarantee_progress, guarantee_progress_reference

    g = torch.Generator().manual_seed(0)
    for trial in range(2000):
        b, w = torch.randint(1, 6, (2,), generator=g).tolist()
        active = torch.rand(b, w, generator=g) < 0.5
        commit = torch.rand(b, w, generator=g) < 0.2
        score = None if trial % 3 == 0 else torch.randint(0, 3, (b, w), generator=g).float()
        if score is not None and trial % 5 == 0:
            score[0, 0] = float("nan") if trial % 2 else float("-inf")
        decision = StepOutput(commit=commit, tokens=torch.zeros(b, w, dtype=torch.long), score=score)
        for last in (False, True):
            for adaptive in (False, True):
                fast = guarantee_progress(decision, active, last=last, adaptive=adaptive)
                ref = guarantee_progress_reference(decision, active, last=last, adaptive=adaptive)
                assert torch.equal(fast, ref), (active, commit, score, last, adaptive)


@pytest.mark.parametrize("sampler, counted", [("low_confidence", True), ("threshold", False), ("fast", False),
                                              ("threshold:schedule_steps=4", True)])
def test_the_block_mask_counts_are_made_for_samplers_that_read_them(model, sampler, counted):
    """``DecodeState.block_masks_at_start`` (one sum per block) is made for a sampler that says it reads
    it (``Sampler.reads_block_masks``) and left None otherwise; the tokens do not depend on it."""
    seen = []
    kw = dict(gen_length=8, block_length=4, steps=8) if sampler == "low_confidence" else dict(gen_length=8,
                                                                                              block_length=4)
    dllm.generate(model, [_ids(model, 6)], sampler=sampler, callback=lambda s: seen.append(
        None if s.block_masks_at_start is None else s.block_masks_at_start.tolist()), **kw)
    assert seen and all((m is not None) == counted for m in seen)
    if counted:
        assert all(0 <= m[0] <= 4 for m in seen)

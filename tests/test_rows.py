"""Released rows (dllm.rows): a row released mid-call leaves the forwards, and the other rows decode
to the same tokens as on the reference path, which forwards every row (``generate(..., skip_released=False)``);
over every registered sampler, both model families, with classifier-free guidance, with KV caches
(the held rows' buffers written back), and for rows that ``stop_at_eos`` finishes."""

import pytest

import dllm
from dllm.models import tiny
from dllm.rows import release_rows
from dllm.samplers import samplers

ALL = [e.name for e in samplers]
PROMPTS = [[7, 8, 9, 10, 11], [12, 13], [14, 15, 16]]


@pytest.fixture(scope="module", params=["llada", "dream"])
def model(request):
    return tiny(request.param, seed=5)


def _run(model, name, *, skip: bool, release_at: int = 1, row: int = 1, **kw):
    def callback(state):  # state.step: steps done (the callback runs after each)
        if state.step == release_at:
            release_rows(state, [row])

    kw.setdefault("gen_length", 8)
    kw.setdefault("block_length", 4)
    return dllm.generate(model, PROMPTS, sampler=name, callback=callback, return_trace=True, seed=0,
                         skip_released=skip, **kw)


@pytest.mark.parametrize("name", ALL)
def test_held_rows_equal_the_reference_path(model, name):
    fast = _run(model, name, skip=True)
    ref = _run(model, name, skip=False)
    for r in (0, 2):  # the held rows: the same tokens, committed at the same steps
        assert fast.sequences[r].tolist() == ref.sequences[r].tolist(), (name, r)
        assert fast.trace[r].tolist() == ref.trace[r].tolist(), (name, r)
    assert fast.nfe == ref.nfe
    sampler = samplers.get(name)
    if sampler.attention_layers or sampler.shadow_block:  # forwards with maps or a shadow block: every row
        assert fast.forwarded_tokens == ref.forwarded_tokens
    else:
        assert fast.forwarded_tokens < ref.forwarded_tokens  # the released row was not computed
    assert (fast.generated != model.mask_id).all() and (ref.generated != model.mask_id).all()


def test_released_row_is_filled_and_never_touched_again(model):
    seen = []

    def callback(state):
        if not seen:  # after the first step
            release_rows(state, [0, 0])  # idempotent
            seen.append(state.generated[0].clone())
        else:
            assert state.generated[0].tolist() == seen[0].tolist()

    out = dllm.generate(model, PROMPTS, sampler="low_confidence", gen_length=8, block_length=4, callback=callback)
    filled = seen[0].tolist()
    assert model.mask_id not in filled and filled.count(model.eos_ids[0]) >= 7  # one step committed one token
    assert out.generated[0].tolist() == filled


def test_classifier_free_guidance_skips_both_halves(model):
    fast = _run(model, "low_confidence", skip=True, cfg_scale=1.5)
    ref = _run(model, "low_confidence", skip=False, cfg_scale=1.5)
    assert fast.sequences[[0, 2]].tolist() == ref.sequences[[0, 2]].tolist()
    steps_after = fast.steps - 1  # forwards after the release (after the first step)
    assert ref.forwarded_tokens - fast.forwarded_tokens == steps_after * 2 * fast.sequences.shape[1]


@pytest.mark.parametrize("cache", ["prefix", "dual", "window", "drift"])
@pytest.mark.parametrize("name", ["low_confidence", "threshold", "fast"])
def test_cached_forwards_skip_released_rows_against_their_buffers(model, cache, name):
    """The held rows' fresh K/V are written back into the call's buffers, so later cached steps see
    the keys the reference path wrote; ``drift`` measures key drift over the batch: every row."""
    try:
        ref = _run(model, name, skip=False, cache=cache)
    except ValueError as err:  # a sampler the policy refuses
        pytest.skip(str(err))
    fast = _run(model, name, skip=True, cache=cache)
    assert fast.sequences[[0, 2]].tolist() == ref.sequences[[0, 2]].tolist()
    assert fast.trace[[0, 2]].tolist() == ref.trace[[0, 2]].tolist()
    assert fast.nfe == ref.nfe
    if cache == "drift":
        assert fast.forwarded_tokens == ref.forwarded_tokens
    else:
        assert fast.forwarded_tokens < ref.forwarded_tokens


@pytest.mark.parametrize("cache,sampler", [("block", "low_confidence"), ("block", "sdar"),
                                           ("subblock", "fastdllm_v2")])
@pytest.mark.parametrize("cfg_scale", [0.0, 1.5], ids=["plain", "cfg"])
def test_block_causal_caches_skip_released_rows(cache, sampler, cfg_scale):
    """SDAR's exact block cache reads the keys' positions from the buffers (HeldView.key_positions)."""
    sdar = tiny("sdar", seed=3)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17]]
    outs = {}
    for skip in (True, False):
        outs[skip] = dllm.generate(sdar, prompts, sampler, cache=cache, gen_length=13, cfg_scale=cfg_scale,
                                   callback=lambda st: st.step == 1 and release_rows(st, [1]), skip_released=skip)
    fast, ref = outs[True], outs[False]
    assert fast.sequences[[0, 2]].tolist() == ref.sequences[[0, 2]].tolist()
    assert fast.forwarded_tokens < ref.forwarded_tokens


def test_stop_at_eos_rows_leave_the_forwards():
    model = tiny("llada", seed=5)

    def eos_first(state):  # row 0 holds EOS after the first step: it finishes after block 0
        if state.step == 1:
            state.generated[0, :4] = model.eos_ids[0]
            state.trace[0, :4] = 0

    kw = dict(gen_length=12, block_length=4, stop_at_eos=True, callback=eos_first)
    ref = dllm.generate(model, PROMPTS, sampler="low_confidence", skip_released=False, **kw)
    fast = dllm.generate(model, PROMPTS, sampler="low_confidence", **kw)
    assert fast.sequences.tolist() == ref.sequences.tolist()
    assert fast.generated[0].tolist() == [model.eos_ids[0]] * 12
    width = fast.sequences.shape[1]
    assert ref.forwarded_tokens - fast.forwarded_tokens == 8 * width  # blocks 1 and 2: 8 steps of one row


def test_every_row_released_forwards_one_row():
    model = tiny("llada", seed=5)
    widths = []
    model.register_forward_pre_hook(lambda m, args: widths.append(args[0].shape[0]))
    dllm.generate(model, PROMPTS, gen_length=8, block_length=8,
                  callback=lambda st: st.step == 1 and release_rows(st, [0, 1, 2]))
    assert widths == [3] + [1] * 7  # the budgeted steps still run, on one row


@pytest.mark.parametrize("name", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_counts_ignore_released_rows(name):
    """Dream's fixed-step samplers commit a count planned from the batch's mean masks: a released row
    (filled, no masks) must not lower it, so rows of equal length still decode as alone."""
    model = tiny("dream", seed=5)
    prompts = [[7, 8, 9], [12, 13, 14], [15, 16, 17]]
    kw = dict(sampler=name, gen_length=16, block_length=8, steps=4)
    out = dllm.generate(model, prompts, callback=lambda st: st.step == 1 and release_rows(st, [1]), **kw)
    for r in (0, 2):
        assert out.sequences[r].tolist() == dllm.generate(model, [prompts[r]], **kw).sequences[0].tolist()


def test_bad_rows_are_refused(model):
    def callback(state):
        release_rows(state, [3])

    with pytest.raises(ValueError, match=r"batch row index in \[0, 3\), got 3"):
        dllm.generate(model, PROMPTS, gen_length=4, callback=callback)
    with pytest.raises(ValueError, match="got True"):
        dllm.generate(model, PROMPTS, gen_length=4, callback=lambda s: release_rows(s, [True]))

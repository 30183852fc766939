"""``dllm.engine.running.RunningDecode``: rows that join a running decode at any step, with prompts and
answers of other lengths, decode to the tokens ``generate`` gives each prompt alone, with its counts;
what cannot run this way is refused with the reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dllm
from dllm.engine.running import RunningDecode, group_of, unsupported_reason
from dllm.inputs import encode_prompts
from dllm.samplers import list_samplers, make_sampler
from dllm.settings import DecodeSettings

PROMPTS = [[5 + i % 7 for i in range(n)] for n in (3, 9, 5, 12, 4, 7)]
JOINS = {0: [0, 1], 2: [2], 3: [3, 4], 6: [5]}  # step -> rows that join before it
SEED = 100  # row i's seed: SEED + i (temperature > 0)


@pytest.fixture(scope="module", params=["tiny-llada", "tiny-dream"])
def model(request):
    return dllm.load(request.param, dtype=torch.float32)


def run(model, settings: DecodeSettings, gens: list[int], joins=JOINS, watch: bool = False, reads=None):
    """Rows join at the steps of ``joins``; returns {row: RowStep at its end} and the decode."""
    def read(tensors):
        if reads is not None:
            reads.append(len(tensors))
        return [t.tolist() for t in tensors]

    decode = RunningDecode(model, settings, group_of(model, settings, gens[0]), read=read)
    ended, t = {}, 0
    while len(decode) or any(step >= t for step in joins):
        for i in joins.get(t, []):
            decode.add(PROMPTS[i], gens[i], i, seed=SEED + i)
        for st in decode.step(watch):
            assert st.tag not in ended
            if st.done:
                ended[st.tag] = st
        t += 1
    return ended, decode


GENS = [8, 4, 12, 8, 6, 10]


@pytest.mark.parametrize("spec, steps, block, gens", [
    ("low_confidence", None, None, GENS),  # one token per step, answers of any length
    ("low_confidence:ties=first", None, None, GENS),
    ("low_confidence", 4, None, [8] * 6),  # two tokens per step (steps=4 of 8)
    ("threshold", None, None, GENS),
    ("threshold:threshold=0.5", None, None, GENS),
    ("eb:gamma=0.5", None, None, GENS),
    ("eb:gamma=0.5,proxy=margin", None, None, GENS),
    ("localleap", None, None, GENS),
    ("hierarchy", None, None, GENS),
    ("low_confidence", None, 4, GENS),  # blocks of 4 (a last one of 2): rows at different blocks
    ("low_confidence", 4, 4, [8] * 6),  # two blocks of two steps
    ("threshold", None, 4, GENS),
    ("threshold:threshold=0.5", None, 3, GENS),
    ("eb:gamma=0.5", None, 4, GENS),
    ("hierarchy", None, 4, GENS),
    ("low_confidence@1.0", None, None, GENS),  # sampled: each row from its own seed
    ("low_confidence@0.7", None, 4, GENS),
    ("threshold@1.0", None, None, GENS),
    ("threshold:stats=torch@0.7", None, 3, GENS),
    ("eb:gamma=0.5@1.0", None, 4, GENS),
    ("localleap@1.0", None, None, GENS),
    ("hierarchy@1.0", None, 4, GENS),
])
def test_rows_joining_at_any_step_decode_as_alone(model, spec, steps, block, gens):
    check_as_alone(model, spec, dict(steps=steps, block_length=block), gens)


@pytest.mark.parametrize("spec, block", [("low_confidence", None), ("threshold", 4), ("low_confidence@1.0", 4)])
def test_guided_rows_decode_as_alone(model, spec, block):
    """Classifier-free guidance: each row also forwarded with its prompt masked, as alone."""
    check_as_alone(model, spec, dict(block_length=block, cfg_scale=1.5), GENS)


def check_as_alone(model, spec: str, fields: dict, gens: list[int], own_tokens: bool = True) -> None:
    """Rows of ``spec`` (``SAMPLER[@TEMPERATURE]``) and settings ``fields`` joining at the steps of
    ``JOINS`` end with the ids and counts of ``generate`` on each prompt alone, with its seed
    (``own_tokens=False``: forwarded tokens at least alone's, LoPA's compacted variant batches)."""
    spec, _, temperature = spec.partition("@")
    settings = DecodeSettings(sampler=spec, temperature=float(temperature or 0), **fields)
    ended, decode = run(model, settings, gens)
    assert sorted(ended) == list(range(len(PROMPTS)))
    for i, (p, g) in enumerate(zip(PROMPTS, gens)):
        seeded = dataclasses.replace(settings, seed=SEED + i if settings.temperature else None)
        alone = dllm.generate(model, [p], gen_length=g, stop_at_eos=True, **seeded.generate_kwargs())
        assert ended[i].ids == alone.generated_ids[0], i
        assert ended[i].nfe == alone.nfe, i
        assert ended[i].forwarded_tokens == alone.forwarded_tokens or (
            not own_tokens and ended[i].forwarded_tokens > alone.forwarded_tokens), i
    assert decode.forwards < sum(st.nfe for st in ended.values())  # rows shared forwards
    assert len(decode) == 0 and decode.x is None and decode.kv is None


CACHED_GENS = [8, 4, 12, 8, 6, 10]  # blocks of 4, and last ones of 2: cached rows of two widths in a step


@pytest.mark.parametrize("spec, cache, block, gens", [
    ("low_confidence", "dual", 4, CACHED_GENS),  # rows at different blocks: full and cached rows in one step
    ("threshold", "dual", 4, CACHED_GENS),
    ("threshold", "prefix", 4, CACHED_GENS),
    ("threshold", "auto", 4, CACHED_GENS),  # dual with dInfer's look-back and look-ahead
    ("threshold", "dual:refresh=2", 4, CACHED_GENS),
    ("low_confidence", "dual:warmup=2", 4, CACHED_GENS),
    ("eb:gamma=0.5", "prefix", 4, CACHED_GENS),
    ("threshold", "dual", None, [8] * 6),  # one block per row
    ("threshold", "dual", None, GENS),  # one block per row, of its own width: a full row's canvas inside the window
    ("low_confidence", "prefix", None, GENS),
    ("low_confidence@1.0", "dual", 4, CACHED_GENS),  # each row draws over its own query, as alone
    ("threshold@0.7", "prefix", 4, CACHED_GENS),
])
def test_cached_rows_decode_as_alone(model, spec, cache, block, gens):
    check_as_alone(model, spec, dict(cache=cache, block_length=block), gens)


@pytest.mark.parametrize("spec, block", [
    ("fast", None),  # LoPA, reuse: rows carry their winner's logits; compacted variant batches
    ("fast:compact=False", None),  # static variant batches (as on CUDA): every row's counts as alone
    ("fast", 4),
    ("fast:compact=False", 4),
    ("lopa", 4),  # no reuse: every step forwards, then its variants, with the bonus fills
    ("lopa:branches=2,verify_variants=False", None),
    ("fast@dual", None),  # under a cache: each row's variants against copies of its buffers
    ("fast:compact=False@dual", 4),
    ("fast@auto", 4),
    ("lopa@prefix", 4),
    # as CUDA runs fast (the fused statistics and LoPA's selection kernels, here interpreted): a row's
    # carried statistics are its decode's, which the sampler takes only for those very logits
    pytest.param("fast:compact=False,stats=fused", 4, marks=pytest.mark.slow),
    pytest.param("fast:compact=False,stats=fused@dual", 4, marks=pytest.mark.slow),
])
def test_lopa_rows_decode_as_alone(model, spec, block):
    spec, _, cache = spec.partition("@")
    check_as_alone(model, spec, dict(block_length=block, cache=cache or "none"), GENS,
                   own_tokens="compact=False" in spec)


def test_cached_groups_and_refusals(model):
    dual = DecodeSettings(sampler="threshold", cache="dual", block_length=4)
    assert group_of(model, dual, 6) == group_of(model, dual, 12) == ("adaptive",)  # blocks of 2 and 4 share one
    reason = unsupported_reason(model, DecodeSettings(cache="window"), 8)
    assert reason is not None and "cache 'window'" in reason
    assert group_of(model, DecodeSettings(sampler="fast", cache="dual"), 8) == ("adaptive",)


@pytest.mark.parametrize("spec, cache", [("low_confidence", "none"), ("low_confidence", "dual"),
                                         ("fast:compact=False", "none"), ("fast", "auto")])
def test_a_row_removed_mid_way_leaves_the_others_unchanged(model, spec, cache):
    settings = DecodeSettings(sampler=spec, cache=cache)
    decode = RunningDecode(model, settings, group_of(model, settings, 8))
    for i in range(4):
        decode.add(PROMPTS[i], 8, i)
    ended = {}
    for t in range(8):
        if t == 2:
            decode.remove([1])  # its canvas row, K/V rows and carried logits leave with it
        for st in decode.step():
            assert st.tag != 1 or t < 2
            if st.done:
                ended[st.tag] = st.ids
        if not len(decode):
            break
    assert sorted(ended) == [0, 2, 3] and len(decode) == 0
    for i in (0, 2, 3):
        assert ended[i] == dllm.generate(model, [PROMPTS[i]], gen_length=8, **settings.generate_kwargs()).generated_ids[0]


def test_a_fixed_step_decode_reads_only_where_a_row_ends(model):
    settings, gens = DecodeSettings(sampler="low_confidence"), [8, 4, 12, 8, 6, 10]
    reads: list[int] = []
    ended, decode = run(model, settings, gens, reads=reads)
    end_steps = {st.nfe + min(s for s, rows in JOINS.items() if i in rows) for i, st in ended.items()}
    assert len(reads) == len(end_steps) < decode.forwards  # one read per step where rows end, no other
    watched: list[int] = []
    run(model, settings, gens, watch=True, reads=watched)
    assert len(watched) == decode.forwards  # watched: every step


def test_groups_and_what_cannot_join(model):
    low = DecodeSettings(sampler="low_confidence")
    assert group_of(model, low, 8) == group_of(model, low, 12) == ("fixed", 1)
    assert group_of(model, DecodeSettings(sampler="low_confidence", steps=4), 8) == ("fixed", 2)
    assert group_of(model, DecodeSettings(sampler="threshold"), 5) == ("adaptive",)
    refused = {
        "cfg_scale=1.0 with cache 'dual'": DecodeSettings(cfg_scale=1.0, cache="dual"),
        "cfg_scale=1.0 with sampler 'fast'": DecodeSettings(cfg_scale=1.0, sampler="fast"),
        "cache 'drift'": DecodeSettings(cache="drift"),
        "sampler 'ssd'": DecodeSettings(sampler="ssd"),
        "sampler 'random'": DecodeSettings(sampler="random"),
        "sampler 'threshold'": DecodeSettings(sampler="threshold:schedule_steps=4"),
        "sampler 'low_confidence'": DecodeSettings(sampler="low_confidence", steps=3),  # 8 / 3: uneven
        "masks per step": DecodeSettings(sampler="low_confidence", block_length=6, steps=4),  # 6, 2 in 2 steps each
    }
    for why, settings in refused.items():
        reason = unsupported_reason(model, settings, 8)
        assert reason is not None and why in reason, (why, reason)
        assert group_of(model, settings, 8) is None
    for bad in (("fixed", 0), None, ("fixed",), ["adaptive"], ("fixed", 1.5)):  # None: group_of's refusal
        with pytest.raises(ValueError, match=r"group must be \('adaptive',\) or \('fixed', k >= 1\)"):
            RunningDecode(model, low, bad)
    two_per_step = RunningDecode(model, DecodeSettings(sampler="low_confidence", steps=4), ("fixed", 1))
    with pytest.raises(ValueError, match=r"group \('fixed', 2\), this decode's is \('fixed', 1\)"):
        two_per_step.add(PROMPTS[0], 8, "x")
    decode = RunningDecode(model, low, ("fixed", 1))
    with pytest.raises(ValueError, match="non-empty prompt"):
        decode.add([], 8, "y")
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64 - 1\]"):
        decode.add(PROMPTS[0], 8, "s", seed=-1)
    with pytest.raises(ValueError, match="exceeds the model's"):
        decode.add(PROMPTS[0] * 1000, 8, "p")
    decode.add(PROMPTS[0], 8, "z")
    with pytest.raises(ValueError, match="tagged 'z' is already"):
        decode.add(PROMPTS[1], 8, "z")
    decode.remove(["z"])
    assert decode.step() == []  # no rows: nothing runs


def test_a_block_causal_model_cannot_join():
    sdar = dllm.load("tiny-sdar")
    reason = unsupported_reason(sdar, DecodeSettings(sampler="low_confidence"), 8)
    assert reason is not None and "block-causal" in reason


def test_only_the_samplers_tested_here_say_they_join_mid_block():
    joining = set()
    for name, _ in list_samplers():
        sampler = make_sampler(name.split()[0])  # "name (alias ...)"
        if sampler.joins_mid_block(8, 8) or sampler.joins_mid_block(8, None):
            joining.add(sampler.name)
    assert joining == {"low_confidence", "threshold", "eb", "localleap", "hierarchy", "lopa", "fast"}


@pytest.mark.parametrize("spec", ["threshold", "fast"])  # fast: its variant forwards in the same calls
def test_a_split_forward_gives_the_same_rows(model, spec):
    """The step's forward in several calls (``split``: here pairs of rows) changes no row's answer."""
    settings, gens = DecodeSettings(sampler=spec), [8, 4, 12, 8, 6, 10]
    calls: list[int] = []

    def pairs(lengths):
        assert lengths == sorted(lengths)  # rows are kept by length
        calls.append(len(lengths))
        return [list(range(i, min(i + 2, len(lengths)))) for i in range(0, len(lengths), 2)]

    decode = RunningDecode(model, settings, group_of(model, settings, 8), split=pairs)
    for i in range(6):
        decode.add(PROMPTS[i], gens[i], i)
    ended = {}
    while len(decode):
        ended.update({st.tag: st.ids for st in decode.step() if st.done})
    assert calls  # the split was asked
    for i in range(6):
        assert ended[i] == dllm.generate(model, [PROMPTS[i]], gen_length=gens[i], sampler=spec).generated_ids[0]
    bad = RunningDecode(model, settings, ("adaptive",), split=lambda lengths: [[1], [0]])
    bad.add(PROMPTS[0], 8, "a")
    bad.add(PROMPTS[1], 8, "b")
    with pytest.raises(ValueError, match="consecutive runs"):
        bad.step()


@pytest.mark.parametrize("spec, cache", [("threshold", "none"), ("threshold", "dual"), ("fast", "auto")])
def test_answers_that_end_early_stop_as_generate_does(spec, cache):
    """Task prompts with room after their answers: after a block holding an EOS with no mask before it
    a row stops, as ``generate(stop_at_eos=True)`` stops it (the same ids, its masks EOS, its NFE)."""
    model = dllm.load("tiny-llada", dtype=torch.float32)
    texts = ["[BOS] sort D A C B [SEP]", "[BOS] reverse A B C D [SEP]", "[BOS] copy A B C [SEP]",
             "[BOS] sort G F E D C B A [SEP]", "[BOS] reverse K J I H G F [SEP]", "[BOS] copy P O N M [SEP]"]
    prompts = encode_prompts(model, texts)
    settings, g = DecodeSettings(sampler=spec, cache=cache, block_length=4), 32
    decode = RunningDecode(model, settings, group_of(model, settings, g))
    ended, joins = {}, {0: [0, 1, 2], 3: [3], 5: [4, 5]}
    for t in range(100):
        for i in joins.get(t, []):
            decode.add(prompts[i], g, i)
        ended.update({st.tag: st for st in decode.step() if st.done})
        if len(ended) == len(texts):
            break
    early = 0
    for i, p in enumerate(prompts):
        alone = dllm.generate(model, [p], gen_length=g, stop_at_eos=True, **settings.generate_kwargs())
        assert (ended[i].ids, ended[i].nfe) == (alone.generated_ids[0], alone.nfe), i
        early += alone.nfe < dllm.generate(model, [p], gen_length=g, **settings.generate_kwargs()).nfe
    assert early >= 1  # an answer ended blocks before its last (the sort: at its first block)


def test_window_rows_are_checked():
    from dllm.samplers.draws import WindowRows

    g = torch.Generator().manual_seed(0)
    rows = WindowRows((g, g), (0, 2), widths=(4, 2), queries=((9, 5, 9), (6, 4, 6)), window=4)
    assert [rows.cut(r, None) for r in range(2)] == [0, 2]  # the window's columns left of each row's block
    with pytest.raises(ValueError, match="a width in"):
        WindowRows((g,), (0,), widths=(5,), queries=((9, 4, 9),), window=4)

"""``dllm.engine.running.RunningDecode``: rows that join a running decode at any step, with prompts and
answers of other lengths, decode to the tokens ``generate`` gives each prompt alone, with its counts;
what cannot run this way is refused with the reason."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.engine.running import RunningDecode, group_of, unsupported_reason
from dllm.samplers import list_samplers, make_sampler
from dllm.settings import DecodeSettings

PROMPTS = [[5 + i % 7 for i in range(n)] for n in (3, 9, 5, 12, 4, 7)]
JOINS = {0: [0, 1], 2: [2], 3: [3, 4], 6: [5]}  # step -> rows that join before it


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
            decode.add(PROMPTS[i], gens[i], i)
        for st in decode.step(watch):
            assert st.tag not in ended
            if st.done:
                ended[st.tag] = st
        t += 1
    return ended, decode


@pytest.mark.parametrize("spec, steps, gens", [
    ("low_confidence", None, [8, 4, 12, 8, 6, 10]),  # one token per step, answers of any length
    ("low_confidence:ties=first", None, [8, 4, 12, 8, 6, 10]),
    ("low_confidence", 4, [8, 8, 8, 8, 8, 8]),  # two tokens per step (steps=4 of 8)
    ("threshold", None, [8, 4, 12, 8, 6, 10]),
    ("threshold:threshold=0.5", None, [8, 4, 12, 8, 6, 10]),
    ("eb:gamma=0.5", None, [8, 4, 12, 8, 6, 10]),
    ("eb:gamma=0.5,proxy=margin", None, [8, 4, 12, 8, 6, 10]),
    ("localleap", None, [8, 4, 12, 8, 6, 10]),
    ("hierarchy", None, [8, 4, 12, 8, 6, 10]),
])
def test_rows_joining_at_any_step_decode_as_alone(model, spec, steps, gens):
    settings = DecodeSettings(sampler=spec, steps=steps)
    ended, decode = run(model, settings, gens)
    assert sorted(ended) == list(range(len(PROMPTS)))
    for i, (p, g) in enumerate(zip(PROMPTS, gens)):
        alone = dllm.generate(model, [p], gen_length=g, **settings.generate_kwargs())
        assert ended[i].ids == alone.generated_ids[0], i
        assert (ended[i].nfe, ended[i].forwarded_tokens) == (alone.nfe, alone.forwarded_tokens), i
    assert decode.forwards < sum(st.nfe for st in ended.values())  # rows shared forwards
    assert len(decode) == 0 and decode.x is None


def test_a_row_removed_mid_way_leaves_the_others_unchanged(model):
    settings = DecodeSettings(sampler="low_confidence")
    decode = RunningDecode(model, settings, group_of(model, settings, 8))
    for i in range(4):
        decode.add(PROMPTS[i], 8, i)
    ended = {}
    for t in range(8):
        if t == 3:
            decode.remove([1])
        for st in decode.step():
            assert st.tag != 1 or t < 3
            if st.done:
                ended[st.tag] = st.ids
    assert sorted(ended) == [0, 2, 3] and len(decode) == 0
    for i in (0, 2, 3):
        assert ended[i] == dllm.generate(model, [PROMPTS[i]], gen_length=8).generated_ids[0]


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
        "temperature": DecodeSettings(temperature=1.0, seed=1),
        "cfg_scale": DecodeSettings(cfg_scale=1.0),
        "cache 'dual'": DecodeSettings(cache="dual"),
        "block_length=4": DecodeSettings(block_length=4),
        "sampler 'fast'": DecodeSettings(sampler="fast"),
        "sampler 'random'": DecodeSettings(sampler="random"),
        "sampler 'threshold'": DecodeSettings(sampler="threshold:schedule_steps=4"),
        "sampler 'low_confidence'": DecodeSettings(sampler="low_confidence", steps=3),  # 8 / 3: uneven
    }
    for why, settings in refused.items():
        reason = unsupported_reason(model, settings, 8)
        assert reason is not None and why in reason, (why, reason)
        assert group_of(model, settings, 8) is None
    with pytest.raises(ValueError, match="cannot|group"):
        RunningDecode(model, low, ("fixed", 0))
    two_per_step = RunningDecode(model, DecodeSettings(sampler="low_confidence", steps=4), ("fixed", 1))
    with pytest.raises(ValueError, match=r"group \('fixed', 2\), this decode's is \('fixed', 1\)"):
        two_per_step.add(PROMPTS[0], 8, "x")
    decode = RunningDecode(model, low, ("fixed", 1))
    with pytest.raises(ValueError, match="non-empty prompt"):
        decode.add([], 8, "y")
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
    assert joining == {"low_confidence", "threshold", "eb", "localleap", "hierarchy"}


def test_a_split_forward_gives_the_same_rows(model):
    """The step's forward in several calls (``split``: here pairs of rows) changes no row's answer."""
    settings, gens = DecodeSettings(sampler="threshold"), [8, 4, 12, 8, 6, 10]
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
        assert ended[i] == dllm.generate(model, [PROMPTS[i]], gen_length=gens[i], sampler="threshold").generated_ids[0]
    bad = RunningDecode(model, settings, ("adaptive",), split=lambda lengths: [[1], [0]])
    bad.add(PROMPTS[0], 8, "a")
    bad.add(PROMPTS[1], 8, "b")
    with pytest.raises(ValueError, match="consecutive runs"):
        bad.step()

"""Host syncs in sampler code: every read of a device value by the host (``.tolist()``, ``bool(t)``,
``nonzero``, boolean-mask indexing, ``torch.tensor`` of Python data, ...) that a sampler's
``begin_block`` / ``step`` issues, counted per decode step by ``dllm.eval.bench.counters``.

``low_confidence``, ``threshold`` and ``fast`` issue none (``fast`` as it runs on CUDA: its variant
batch is compacted elsewhere, one read at a block's first step, ``compact="auto"``). Every other sampler is held to the most
syncs in one step measured when its rule was last changed (``MOST_PER_STEP``), so a new sync fails
here. The engine's own syncs (its adaptive loop condition, prompt preparation) and the model's are
not the sampler's and are not counted. ``benchmarks/host_syncs.py`` prints the same counts as a table
(``docs/results/host-syncs.md``).
"""

from __future__ import annotations

import functools

import pytest

import dllm
from dllm.eval.bench.counters import count_generate
from dllm.models.tiny import tiny
from dllm.samplers import samplers

SAMPLER_CODE = "@ dllm/samplers/"  # sync sites read "kind @ dllm/samplers/file.py:line"
SYNC_FREE = ("low_confidence", "threshold", "fast")
AS_ON_CUDA = {"fast": "fast:compact=False"}  # fast's compact="auto" resolves so on CUDA

# The most sampler-code syncs in one step, (T = 0, T = 1), for the samplers that have any; every
# other registered sampler has none. Each is a read the rule needs on the host:
MOST_PER_STEP = {
    # compact=True (lopa's default): the candidate counts, which shape the variant batch (fast
    # presets compact=False: no read)
    "lopa": (1, None),
    "fast": (1, None),  # on a CPU (compact="auto"); on CUDA none, tested below
    # the verification forward is skipped when no row has a mask left after the threshold set
    "spec_threshold": (1, None),
    # at T > 0 the rows' draft counts, the shape of the reference's uniforms (one [n, V] per row)
    "apd": (0, 1),
    # Dream's rand(#masked) needs the masked count; at T > 0 also the revealed positions, whose
    # number is the shape of the one multinomial over them
    "origin": (1, 2),
    # Dream's k (topk's k) planned from the block's mask counts: one read in a block's first step;
    # at T > 0 the masked positions too, as Dream samples only those (the multinomial's shape)
    "entropy": (1, 2),
    "maskgit_plus": (1, 2),
    "topk_margin": (1, 2),
}


def _names() -> list[str]:
    return sorted(name for name, _ in dllm.list_samplers())


@functools.lru_cache(maxsize=None)
def _model():
    return tiny("llada", d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64, n_layers=2)


def _prompts(batch: int) -> list[list[int]]:
    """One row, or two rows of different lengths (the shorter left padded)."""
    return [[11, 12, 13, 14, 15, 16], [17, 18, 19]][:batch]


def _sampler_syncs(name: str, cache: str, batch: int, temperature: float) -> list[list[str]]:
    counter = count_generate(_model(), _prompts(batch), sampler=name, gen_length=16, block_length=8,
                             cache=cache, temperature=temperature, seed=0)
    assert counter.steps, name
    return [[site for site in step.syncs if SAMPLER_CODE in site] for step in counter.steps]


def test_the_bounds_name_registered_samplers():
    names = set(_names())
    assert set(MOST_PER_STEP) <= names and set(SYNC_FREE) <= names
    assert not set(MOST_PER_STEP) & set(SYNC_FREE) - set(AS_ON_CUDA)


@pytest.mark.parametrize("batch", [1, 2], ids=["one-row", "ragged"])
@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("name", _names())
def test_sampler_syncs_per_step(name, cache, batch):
    greedy_only = samplers.get(name).greedy_only
    bounds = MOST_PER_STEP.get(name, (0, 0))
    for temperature, bound in zip((0.0, 1.0), bounds):
        if temperature > 0 and (greedy_only or cache != "none"):  # T > 0: the draws, with any cache
            continue
        if name in SYNC_FREE:
            per_cuda_step = _sampler_syncs(AS_ON_CUDA.get(name, name), cache, batch, temperature)
            sites = sorted({site for step in per_cuda_step for site in step})
            assert not sites, f"{name} (T={temperature}) syncs in sampler code: {sites}"
        per_step = _sampler_syncs(name, cache, batch, temperature)
        sites = sorted({site for step in per_step for site in step})
        most = max(len(step) for step in per_step)
        assert most <= bound, f"{name} (T={temperature}): {most} syncs in one step > {bound}: {sites}"


def test_the_counter_sees_a_sampler_sync():
    # the counter finds a sync issued in sampler code: lopa's compact read, gone with compact=False
    counter = count_generate(_model(), _prompts(2), sampler="lopa", gen_length=16, block_length=8)
    assert any(SAMPLER_CODE + "lopa.py" in site for step in counter.steps for site in step.syncs)
    counter = count_generate(_model(), _prompts(2), sampler="lopa", gen_length=16, block_length=8,
                             compact=False)
    assert not any(SAMPLER_CODE in site for step in counter.steps for site in step.syncs)

"""SDAR's official decoding loop (generate.py, transcribed in tests/reference/decoders/sdar_generate.py over
the transcribed official modelling) against ``dllm.generate(model, ..., "sdar", cache="block")``:
token for token on 20 prompts per setting, several block sizes, thresholds, strategies and
temperatures, with the official stop test.

Where the official ``topk`` selects non-mask positions (fewer masks left than the step's quota,
possible only with ``denoising_steps < block_size``) it rewrites committed or prompt tokens, which
dllm never does (dllm/samplers/sdar.py); those runs are detected (the transcription logs them) and
excluded, and the runs left must all be equal."""

from __future__ import annotations

import pytest
import torch

import dllm
from dllm.models import load, tiny
from tests.reference.decoders.sdar_generate import ref_num_transfer_tokens, sdar_generate
from tests.reference.modelling.sdar_modeling import RefSDARForCausalLM

N_PROMPTS = 20
EOT_SCALE = 5.0
STOPS: list[int] = []  # per comparison: runs where the official stop test ended the loop early


# the fast suite runs block size 4 and one setting of the grid below; `pytest -m slow` runs all of it
@pytest.fixture(scope="module", params=[4, pytest.param(8, marks=pytest.mark.slow)], ids=lambda bs: f"bs{bs}")
def pair(request, tmp_path_factory):
    bs = request.param
    path = tmp_path_factory.mktemp(f"sdar-bs{bs}")
    model = tiny("sdar", seed=11, block_size=bs)
    with torch.no_grad():  # a larger <|im_end|> row: its logit swings wider, so some answers end early
        model.transformer.lm_head.weight[model.eot_id] *= EOT_SCALE
    model.save_pretrained(path)
    return RefSDARForCausalLM.from_pretrained(path), load(path)


def _prompt(i: int, bs: int) -> tuple[torch.Tensor, int]:
    g = torch.Generator().manual_seed(100 + i)
    n = int(torch.randint(3, 15, (1,), generator=g))
    prompt = torch.randint(10, 100, (1, n), generator=g)
    return prompt, (-(n + 12)) % bs + 12  # gen_length reaching a block boundary, as the official canvas


def _compare(ref, ours, strategy, threshold, temperature, steps, cache="block", top_k=0, top_p=1.0):
    bs = ours.config.block_size
    steps = steps or bs
    equal, skipped, stopped = 0, 0, 0
    for i in range(N_PROMPTS):
        prompt, gen = _prompt(i, bs)
        overwrites: list = []
        torch.manual_seed(i)
        r = sdar_generate(ref, prompt, ours.mask_id, gen_length=gen, block_length=bs, denoising_steps=steps,
                          temperature=temperature, top_k=top_k, top_p=top_p, remasking_strategy=strategy,
                          confidence_threshold=threshold, stopping_criteria_idx=list(ours.eos_ids),
                          overwrites=overwrites)[0]
        o = dllm.generate(ours, prompt, "sdar", gen_length=gen, cache=cache, temperature=temperature, seed=i,
                          stop_at_eos=True, denoising_steps=steps, strategy=strategy, threshold=threshold,
                          top_k=top_k, top_p=top_p).sequences[0]
        if overwrites:
            skipped += 1
            continue
        decoded = r != ours.mask_id  # after a stop the official canvas keeps masks, dllm's holds EOS
        assert torch.equal(o[decoded], r[decoded]), (i, r.tolist(), o.tolist())
        assert torch.isin(o[~decoded], torch.tensor(ours.eos_ids)).all()
        equal += 1
        stopped += bool((~decoded).any())
    STOPS.append(stopped)
    return equal, skipped


GRID = [(strategy, threshold, temperature)
        for strategy, threshold in [("low_confidence_dynamic", 0.85), ("low_confidence_dynamic", 0.3),
                                    ("low_confidence_dynamic", 0.99), ("low_confidence_static", 0.85),
                                    ("sequential", 0.85)]
        for temperature in (1.0, 0.7)]


@pytest.mark.parametrize("strategy,threshold,temperature",
                         [pytest.param(*g, marks=() if i == 0 else pytest.mark.slow) for i, g in enumerate(GRID)])
def test_token_equal_one_token_per_step(pair, strategy, threshold, temperature):
    """denoising_steps == block_size (the released setting): every run equal, none skipped."""
    equal, skipped = _compare(*pair, strategy, threshold, temperature, steps=None)
    assert (equal, skipped) == (N_PROMPTS, 0)


def test_eos_stop_is_exercised(pair):
    """The comparisons above include runs that the official stop test ends early (EOS or <|im_end|>
    in a block before the last), where dllm's stop_at_eos must stop at the same block."""
    STOPS.clear()
    for temperature in (1.0, 0.7):
        _compare(*pair, "low_confidence_dynamic", 0.85, temperature, steps=None)
    assert sum(STOPS) >= 1


def test_token_equal_with_top_k_top_p(pair):
    equal, skipped = _compare(*pair, "low_confidence_dynamic", 0.5, 0.9, steps=None, top_k=20, top_p=0.95)
    assert (equal, skipped) == (N_PROMPTS, 0)


def test_token_equal_without_cache(pair):
    equal, _ = _compare(*pair, "low_confidence_dynamic", 0.85, 1.0, steps=None, cache="none")
    assert equal == N_PROMPTS


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "sequential"])
def test_fewer_steps_equal_where_the_official_rewrites_nothing(pair, strategy):
    ref, ours = pair
    equal, skipped = _compare(ref, ours, strategy, 0.85, 1.0, steps=ours.config.block_size // 2)
    assert equal + skipped == N_PROMPTS
    if strategy == "sequential":  # its transfer set never leaves the masks
        assert skipped == 0
    assert equal >= 1


def test_nfe_one_fewer_per_block_than_the_official_store_forward(pair):
    ref, ours = pair
    bs = ours.config.block_size
    prompt, gen = _prompt(0, bs)
    counts: dict = {}
    torch.manual_seed(0)
    sdar_generate(ref, prompt, ours.mask_id, gen_length=gen, block_length=bs, denoising_steps=bs, counts=counts)
    out = dllm.generate(ours, prompt, "sdar", gen_length=gen, cache="block", temperature=1.0, seed=0,
                        denoising_steps=bs)
    n = prompt.shape[1]
    blocks = (n + gen) // bs - n // bs  # decoded grid blocks
    prefill = 1 if n >= bs else 0
    assert out.nfe == counts["nfe"] - blocks - prefill  # no store_kv forward per block, no separate prefill


def test_transfer_counts_match_the_official_schedule():
    from dllm.samplers.sdar import transfer_counts

    for block, steps in [(4, 4), (8, 3), (16, 5), (4, 1)]:
        assert transfer_counts(block, steps) == ref_num_transfer_tokens(block, steps).tolist()


def test_bad_options_and_models():
    model = tiny("sdar", seed=1)
    with pytest.raises(ValueError, match="denoising_steps=8 exceeds the block size 4"):
        dllm.generate(model, [[5, 6, 7]], "sdar", gen_length=5, denoising_steps=8)
    with pytest.raises(ValueError, match="strategy must be one of"):
        dllm.generate(model, [[5, 6, 7]], "sdar", gen_length=5, strategy="entropy_bounded")
    with pytest.raises(ValueError, match="denoising_steps=4 exceeds the block size 2"):
        dllm.generate(tiny("llada", seed=1), [[5, 6, 7]], "sdar", gen_length=8, block_length=2)


def test_bidirectional_model_runs_the_rule_inside_its_blocks():
    """On LLaDA the rule runs inside the call's blocks: at T = 0, denoising_steps = block_length and a
    threshold above every confidence, one token per step, the most confident first = low_confidence."""
    model = tiny("llada", seed=2)
    ours = dllm.generate(model, [[5, 6, 7]], "sdar", gen_length=8, block_length=4, threshold=1.0)
    ref = dllm.generate(model, [[5, 6, 7]], "low_confidence", gen_length=8, block_length=4, steps=8)
    assert torch.equal(ours.sequences, ref.sequences) and ours.nfe == 8

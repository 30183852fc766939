"""Fast-dLLM v2: the checkpoint layout, the config translation, block-causal logits with the token
shift against the transcription of the official modelling (tests/reference/modelling/fastdllm_v2_modeling.py),
and ``sampler="fastdllm_v2"`` token for token against the transcribed official ``generate``
(tests/reference/decoders/fastdllm_v2_generate.py)."""

from __future__ import annotations

import json

import pytest
import torch

import dllm
from dllm.models import load, tiny
from dllm.models.families.fastdllm_v2 import FastDLLMv2
from tests.reference.decoders.fastdllm_v2_generate import fastdllm_v2_generate, official_length
from tests.reference.modelling.fastdllm_v2_modeling import RefFastDLLMv2ForCausalLM

from ..helpers import assert_regenerated, logits_atol, random_ids


def _pair(tmp_path, seed: int, *, frequent_eot: bool = False, **overrides):
    """A tiny random Fast-dLLM v2 saved in the official layout, its official transcription, dllm's load.
    The mask token's head row is zeroed so that no proposal is the mask itself (the official loop
    would "commit" it and, at T = 0, never finish). ``frequent_eot``: <|im_end|>'s head row becomes
    1.05 x that of the token the model generates most, so that runs end early (the official loop's stop)."""
    model = tiny("fastdllm_v2", seed=seed, **overrides)
    head = model.transformer.head_weight()
    with torch.no_grad():
        head[model.mask_id] = 0
        if frequent_eot:
            out = dllm.generate(model, [[5, 6, 7, 8, 9, 10, 11, 12, 13]], "fastdllm_v2", gen_length=40)
            head[model.eot_id] = 1.05 * head[int(torch.bincount(out.sequences[0, 9:]).argmax())]
    model.save_pretrained(tmp_path)
    return RefFastDLLMv2ForCausalLM.from_pretrained(tmp_path), load(tmp_path)


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 4}, {"n_layers": 1}, {"block_size": 4},
                                       {"tie_embeddings": True}])
def test_logits_bit_identical_to_official_modelling(tmp_path, overrides):
    official, ours = _pair(tmp_path, 5, **overrides)
    assert isinstance(ours, FastDLLMv2) and ours.logit_shift == 1 and ours.config.block_causal
    ids = random_ids(ours, 2, 13)
    bs = ours.config.block_size
    ref = official(ids, block_size=bs).logits  # the official 2-D mask
    ref4 = official(ids, block_size=bs, mask_2d=False).logits
    with torch.no_grad():
        mine = ours(ids).logits
    assert torch.equal(mine[:, 1:], ref[:, :-1])  # the token shift: row i - 1 predicts i
    assert torch.equal(mine[:, 1:], ref4[:, :-1])


def test_cached_forward_against_official_past_key_values(tmp_path):
    """The official prefill (update_past_key_values=True) then a block forward against it: the same
    logits as dllm's cached forward over the same columns."""
    official, ours = _pair(tmp_path, 6)
    ids = random_ids(ours, 1, 24)
    out = official(ids[:, :16], use_cache=True, update_past_key_values=True, block_size=8)
    ref = official(ids[:, 16:], use_cache=True, past_key_values=out.past_key_values, block_size=8).logits
    kv = ours.new_kv_cache(1, 24)
    with torch.no_grad():
        ours(ids[:, :16], cache=kv.view(0, 16))
        mine = ours(ids[:, 16:], cache=kv.view(16, 24)).logits  # [:, j] predicts column 16 + j (raw row j - 1)
    assert torch.allclose(mine[:, 1:], ref[:, :-1], atol=1e-5, rtol=0)
    assert torch.equal(mine[:, 1:].argmax(-1), ref[:, :-1].argmax(-1))


def test_bfloat16_bit_identical_too(tmp_path):
    model = tiny("fastdllm_v2", seed=8)
    model.save_pretrained(tmp_path)
    official = RefFastDLLMv2ForCausalLM.from_pretrained(tmp_path, torch.bfloat16)
    ours = load(tmp_path, dtype=torch.bfloat16)
    ids = random_ids(ours, 2, 12)
    with torch.no_grad():
        mine = ours(ids).logits
    assert mine.dtype == torch.bfloat16
    assert torch.equal(mine[:, 1:], official(ids, block_size=8).logits[:, :-1])


def test_save_reload_official_layout(tmp_path):
    model = tiny("fastdllm_v2", seed=7)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "Fast_dLLM_Qwen" and cfg["architectures"] == ["Fast_dLLM_QwenForCausalLM"]
    assert cfg["bd_size"] == 8 and cfg["mask_token_id"] == model.mask_id and "auto_map" not in cfg
    assert cfg["layer_types"] == ["full_attention"] * 2
    again = load(tmp_path)
    assert again.family == "fastdllm_v2" and again.config == model.config and again.special == model.special
    ids = random_ids(model, 2, 10)
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    again.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == cfg
    tok = again.tokenizer
    assert tok.convert_ids_to_tokens(again.mask_id) == "|<MASK>|"
    assert tok.convert_ids_to_tokens(again.eos_id) == "<|im_end|>"


def _rewrite(tmp_path, **changes) -> None:
    path = tmp_path / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
    path.write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, error, words", [
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, NotImplementedError, "rope_scaling"),
    ({"use_sliding_window": True}, NotImplementedError, "use_sliding_window"),
    ({"hidden_act": "gelu"}, NotImplementedError, "hidden_act"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, NotImplementedError, "layer_types"),
    ({"bd_size": 0}, ValueError, "bd_size"),
    ({"bd_size": None}, ValueError, "bd_size"),
])
def test_unsupported_config_fields_are_named(tmp_path, changes, error, words):
    tiny("fastdllm_v2", seed=1).save_pretrained(tmp_path)
    _rewrite(tmp_path, **changes)
    with pytest.raises(error, match=words):
        load(tmp_path)


def test_block_length_must_be_the_trained_block():
    model = tiny("fastdllm_v2", seed=2)
    with pytest.raises(ValueError, match="block_length=4 disagrees"):
        dllm.generate(model, [[5, 6, 7]], "fastdllm_v2", gen_length=8, block_length=4)
    with pytest.raises(ValueError, match="small_block_size=3 must divide the block size 8"):
        dllm.generate(model, [[5, 6, 7]], "fastdllm_v2", gen_length=8, small_block_size=3)


# (temperature, threshold, small_block_size, top_p): greedy and sampled, one to four sub-blocks
SETTINGS = [(0.0, 0.9, 4, 0.95), (0.0, 0.5, 8, 0.95), (0.0, 1.0, 2, 0.95), (1.0, 0.7, 4, 0.95),
            (0.7, 0.3, 2, 0.8)]
# prompt lengths: shorter than a block, ending on a boundary (the arg-max appended after the prefill),
# and inside later blocks; never exactly one block (the official loop then drops the prompt: see the sampler)
LENGTHS = (3, 5, 7, 9, 11, 13, 16, 17, 19, 21, 23, 24, 26, 29, 31, 32, 33, 35, 37, 40)


@pytest.mark.parametrize("frequent_eot", [False, True], ids=["long", "early_stops"])
@pytest.mark.parametrize("cache", ["block", "none", "subblock"])
@pytest.mark.parametrize("temperature, threshold, sbs, top_p", SETTINGS)
def test_official_generate_token_equal(tmp_path, cache, temperature, threshold, sbs, top_p, frequent_eot):
    """20 prompts per setting: dllm's tokens equal the official loop's up to and including its first
    <|im_end|> (where the official output is cut), or all of them when it never appears. The official
    loop runs with ``use_block_cache=False`` against dllm's exact caches ('block', 'none'), and with
    ``use_block_cache=True`` (its sub-block cache, an approximation) against cache 'subblock'. With
    ``frequent_eot`` most runs end early, on the official loop's stop test."""
    official, ours = _pair(tmp_path, 11, frequent_eot=frequent_eot)
    g = torch.Generator().manual_seed(int(threshold * 10) + sbs)
    stopped = 0
    for i, n in enumerate(LENGTHS):
        prompt = torch.randint(5, ours.config.vocab_size - 8, (1, n), generator=g)
        torch.manual_seed(i)
        ref, _ = fastdllm_v2_generate(official, prompt, 24, ours.mask_id, ours.eot_id, threshold=threshold,
                                      small_block_size=sbs, block_size=8, top_p=top_p, temperature=temperature,
                                      use_block_cache=cache == "subblock")
        out = dllm.generate(ours, prompt.tolist(), "fastdllm_v2", gen_length=official_length(n, 8, 24), cache=cache,
                            temperature=temperature, seed=i, threshold=threshold, small_block_size=sbs, top_p=top_p)
        mine = out.sequences[0, n:]
        ends = (mine == ours.eot_id).nonzero()
        if len(ends):
            mine = mine[:int(ends[0, 0]) + 1]
            stopped += 1
        assert mine.tolist() == ref[0, n:].tolist(), f"prompt length {n}"
    if frequent_eot:
        assert stopped >= len(LENGTHS) // 4  # the stop path is exercised
    else:
        assert stopped < len(LENGTHS)  # some runs decode every block


def test_block_cache_equals_recompute_and_forwards_fewer_rows():
    model = tiny("fastdllm_v2", seed=3)
    prompt = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]
    kw = dict(gen_length=21, temperature=0.0, threshold=0.6, small_block_size=4)
    full = dllm.generate(model, prompt, "fastdllm_v2", cache="none", **kw)
    fast = dllm.generate(model, prompt, "fastdllm_v2", cache="block", **kw)
    assert torch.equal(full.sequences, fast.sequences) and full.nfe == fast.nfe
    assert fast.forwarded_tokens < full.forwarded_tokens


from dllm.samplers import list_samplers  # noqa: E402

# LLaDA's "random" remasking draws noise for every query row, so its stream depends on the query length
_ALL = [n.split()[0] for n, _ in list_samplers() if n.split()[0] != "random"]


@pytest.mark.parametrize("sampler", _ALL)
def test_block_cache_is_exact_for_the_shifted_model_with_every_sampler(sampler):
    """The shifted block-causal model under cache 'block' (later steps from g - 1) decodes what cache
    'none' decodes, with every registered sampler at T = 0 (the mask token's head row zeroed: the
    random model would otherwise propose it, which 'sdar' commits as is)."""
    model = tiny("fastdllm_v2", seed=3)
    with torch.no_grad():
        model.transformer.head_weight()[model.mask_id] = 0
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [12, 13, 14]]  # lengths 11 and 3: offset 3 in blocks of 8
    ref = dllm.generate(model, prompts, sampler, gen_length=13, cache="none", seed=7)
    out = dllm.generate(model, prompts, sampler, gen_length=13, cache="block", seed=7)
    assert torch.equal(out.sequences, ref.sequences) and out.nfe == ref.nfe
    assert out.forwarded_tokens < ref.forwarded_tokens


def test_subblock_cache_is_an_approximation_for_fastdllm_v2_only():
    """cache 'subblock' (the official use_block_cache) forwards fewer rows than 'block' and, stale
    keys of the other sub-blocks being read, decodes other tokens on some prompts; other samplers,
    which read logits outside the sub-block, are refused, and so are bidirectional models."""
    model = tiny("fastdllm_v2", seed=11)
    g = torch.Generator().manual_seed(13)
    differ, rows = 0, [0, 0]
    for i in range(8):
        prompt = torch.randint(5, 90, (1, 9 + i), generator=g).tolist()
        kw = dict(gen_length=25, temperature=0.0, threshold=0.9, small_block_size=4)
        exact = dllm.generate(model, prompt, "fastdllm_v2", cache="block", **kw)
        approx = dllm.generate(model, prompt, "fastdllm_v2", cache="subblock", **kw)
        differ += not torch.equal(exact.sequences, approx.sequences)
        rows[0] += exact.forwarded_tokens
        rows[1] += approx.forwarded_tokens
    assert rows[1] < rows[0] and differ > 0
    with pytest.raises(ValueError, match="sampler 'threshold' reads logits outside the current sub-block"):
        dllm.generate(model, [[5, 6, 7]], "threshold", gen_length=8, cache="subblock")
    with pytest.raises(ValueError, match="cache 'subblock' is Fast-dLLM v2's sub-block cache"):
        dllm.generate(tiny("dream", seed=1), [[5, 6, 7]], "fastdllm_v2", gen_length=8, cache="subblock")


def test_every_block_starts_with_the_greedy_token_of_the_previous_block():
    """At T > 0 the block's first generated column is still the arg-max of the previous block's last
    row, committed alone in the block's first step."""
    model = tiny("fastdllm_v2", seed=4)
    prompt = [[5, 6, 7, 8, 9, 10]]  # 6 tokens: the first block ends at column 8
    out = dllm.generate(model, prompt, "fastdllm_v2", gen_length=18, temperature=1.0, seed=3, threshold=0.5,
                        return_trace=True)
    seq = out.sequences
    with torch.no_grad():
        logits = model(seq).logits  # block-causal: the finished canvas gives each row's final logits
    for col in (8, 16):
        assert int(seq[0, col]) == int(logits[0, col].argmax())
    trace = out.trace[0]
    assert int((trace == trace[8 - 6]).sum()) == 1 and int((trace == trace[16 - 6]).sum()) == 1


def test_embedded_tiny_random_fastdllm_v2_is_the_regenerated_checkpoint():
    """dllm/models/embedded/tiny-random-fastdllm-v2 is what ``dllm models make-embedded`` writes
    (tiny("fastdllm_v2", seed=3)), loads offline, and decodes with the exact block cache."""
    from dllm.models import embedded_names

    assert "tiny-random-fastdllm-v2" in embedded_names()
    model = load("tiny-random-fastdllm-v2")
    assert isinstance(model, FastDLLMv2) and model.config.block_size == 8
    ids = random_ids(model, 1, 10)
    with torch.no_grad():
        fresh = tiny("fastdllm_v2", seed=3)
        assert_regenerated(model.transformer.state_dict(), fresh.transformer.state_dict())
        want = fresh(ids).logits
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=logits_atol(model, want))
    out = dllm.generate(model, "what is the sum of 2 and 3 ?", "fastdllm_v2", chat=True, cache="block",
                        gen_length=12, small_block_size=4)
    assert out.sequences.shape[1] == out.prompt_length + 12 and out.texts[0] is not None

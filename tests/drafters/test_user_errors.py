"""The speculative path's answers to what a new user typed (issue 34): each a clear error naming the
bad value and what is valid, never a silent wrong answer, a raw library traceback or an endless run."""

import json
import os
import shutil

import pytest
import torch

import dllm
from dllm.drafters.base import make_drafter
from dllm.models.targets import load_target
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.models.loading import locate

UNKNOWN = "[BOS] copy_long A B C ... [SEP]"  # the README's example: '...' is not a word of the task vocabulary


@pytest.fixture(scope="module")
def ar():
    return load_target("tiny-ar")


@pytest.mark.parametrize("prompt,word", [(UNKNOWN, "'...'"), ("[BOS] copy_long A B \u00c4 [SEP]", "'\u00c4'")])
def test_unknown_words_are_refused_as_generate_refuses_them(ar, prompt, word):
    target, tok = ar
    with pytest.raises(ValueError, match=f"word\\(s\\) the tokenizer does not know: {word}") as ours:
        speculative_generate(target, "ngram", prompt, max_new_tokens=4, tokenizer=tok)
    llada = dllm.load("tiny-llada-long")  # the same task vocabulary and the same refusal in dllm.generate
    with pytest.raises(ValueError) as theirs:
        dllm.generate(llada, prompt, gen_length=4)
    assert str(ours.value).split(";")[0] == str(theirs.value).split(";")[0]


def test_one_prompt_encoder_for_both_paths(ar):
    """A list mixing forms is the same TypeError in both (one function: dllm.inputs.prompt_rows)."""
    target, tok = ar
    with pytest.raises(TypeError, match="got a list mixing"):
        speculative_generate(target, "ngram", ["[BOS] copy A [SEP]", [2, 3]], max_new_tokens=4, tokenizer=tok)
    with pytest.raises(TypeError, match="got a list mixing"):
        dllm.generate(dllm.load("tiny-llada"), ["[BOS] copy A [SEP]", [2, 3]], gen_length=4)


def test_a_tokenizer_of_another_vocabulary_is_refused(ar):
    target, _ = ar
    other = dllm.load("tiny-random-dream").tokenizer  # 106 tokens; the target has 88 embedding rows
    with pytest.raises(ValueError, match=r"the tokenizer has 106 tokens but the target's vocabulary has 88"):
        speculative_generate(target, "ngram", "a b", max_new_tokens=4, tokenizer=other)


@pytest.mark.parametrize("max_new", [507, 10**9])
def test_max_new_tokens_beyond_the_targets_positions_is_refused_at_once(ar, max_new):
    target, tok = ar  # max_position_embeddings 512; the prompt has 6 tokens
    with pytest.raises(ValueError, match=rf"max_new_tokens {max_new} after a prompt of 6 tokens .* "
                                         r"max_position_embeddings 512; use max_new_tokens <= 506"):
        speculative_generate(target, "ngram", "[BOS] copy_long A B C [SEP]", max_new_tokens=max_new, tokenizer=tok,
                             eos_token_id=[])


def _copy(tmp_path, name):
    d = tmp_path / name
    shutil.copytree(locate(name), d)
    return d


def test_load_target_names_a_truncated_weights_file(tmp_path):
    d = _copy(tmp_path, "tiny-ar")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cannot read safetensors file '.*model.safetensors' \(truncated"):
        load_target(str(d))


def test_load_target_names_the_keys_a_wrong_vocab_size_disagrees_with(tmp_path):
    d = _copy(tmp_path, "tiny-ar")
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] = 100
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json says vocab_size 100, but the weights have "
                                         r"lm_head.weight \[88, 128\], model.embed_tokens.weight \[88, 128\]"):
        load_target(str(d))


CORRUPTIONS = {
    "bad-json": lambda cfg, w: (cfg.write_text("{not json"), "is not valid JSON"),
    "empty-object": lambda cfg, w: (cfg.write_text("{}"), "is incomplete or wrong"),
    "json-list": lambda cfg, w: (cfg.write_text("[]"), "must be a JSON object"),
    "random-bytes": lambda cfg, w: (w.write_bytes(os.urandom(256)), "truncated or not safetensors"),
    "truncated": lambda cfg, w: (w.write_bytes(w.read_bytes()[:-7]), "truncated or not safetensors"),
    "wrong-tensors": None,  # filled per head below: a valid file with other tensors
    "missing-weights": lambda cfg, w: (w.unlink(), "is missing"),
}


def _wrong_tensors(weights):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(3)}, str(weights))
    return "do not fit its config"


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
@pytest.mark.parametrize("head", ["block_head", "path_head"])
def test_a_broken_head_is_named_when_used_and_never_touched_by_chain_decoding(ar, tmp_path, kind, head):
    target, tok = ar
    d = _copy(tmp_path, "tiny-ar-dflash-wide")
    cfg, weights = d / f"{head}.json", d / f"{head}.safetensors"
    if kind == "wrong-tensors":
        match = _wrong_tensors(weights)
    else:
        match = CORRUPTIONS[kind](cfg, weights)[1]
    drafter = make_drafter("dflash", model=str(d))  # loads: heads are read on first use
    prompt = "[BOS] copy_long A B C D [SEP]"
    plain = speculative_generate(target, drafter, prompt, max_new_tokens=6, tokenizer=tok, plan=8)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert plain.generated[0] == target.generate(torch.tensor([ids]), max_new_tokens=6,
                                                 do_sample=False)[0, len(ids):].tolist()
    use = dict(plan="auto") if head == "block_head" else dict(plan=Plan(block_size=8, tree="taps:budget=8"))
    with pytest.raises((ValueError, FileNotFoundError), match=match) as err:
        speculative_generate(target, drafter, prompt, max_new_tokens=6, tokenizer=tok, **use)
    assert f"{head}." in str(err.value) and str(d) in str(err.value)


def test_a_seed_past_64_bits_is_refused(ar):
    target, tok = ar
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64 - 1\] .torch.Generator's range., or None, got 1180591620717411303424"):
        speculative_generate(target, "ngram", "[BOS] copy_long A [SEP]", max_new_tokens=4, tokenizer=tok, seed=2**70)

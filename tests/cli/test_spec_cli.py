"""``dllm spec`` and ``dllm drafters``, run in-process through ``dllm.cli.main`` on a tiny random
Qwen3 target saved with a word-level tokenizer (one subprocess test, marked slow)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from dllm.cli import main

WORDS = "the a cat dog sat on mat ran to and it was big small red blue one two three four five six".split()
PROMPTS = ["the cat sat on the mat", "the mat", "the dog ran"]  # greedy: 24, 24 and 8 tokens (EOS)


def _build(directory, tokenizer: bool = True):
    """The brief's tiny target (vocab 32, hidden 32, 2 layers, GQA 2/1), peaked logits (std 0.5: few
    near-ties, so greedy decoding is stable across implementations), EOS 2, saved with its tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dllm.models.text.tokenizer import build_word_tokenizer, save_tokenizer

    tok = build_word_tokenizer(WORDS, ["<pad>", "<eos>"], eos_token="<eos>", pad_token="<pad>")
    cfg = Qwen3Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, initializer_range=0.5, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(directory)
    if tokenizer:
        save_tokenizer(tok, directory)
    return model, tok


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-ar")
    model, tok = _build(directory)
    return directory, model, tok


def _run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("drafter,block", [("ngram", None), ("ngram:max_ngram=2,min_ngram=1", 4), ("prompt_lookup", 1)])
def test_spec_json_equals_the_targets_greedy_generate(capsys, target_dir, drafter, block):
    directory, model, tok = target_dir
    argv = ["spec", "--target", str(directory), "--drafter", drafter, "--prompt", *PROMPTS, "--max-new-tokens", "24"]
    out = _run_json(capsys, argv + (["--block-size", str(block)] if block else []))
    assert out["drafter"] == drafter and len(out["texts"]) == len(out["generated"]) == len(PROMPTS)
    for prompt, got, text, reason in zip(PROMPTS, out["generated"], out["texts"], out["stop_reasons"]):
        ids = torch.tensor([tok.encode(prompt)])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
        assert got == ref[0, ids.shape[1]:].tolist()
        assert text == tok.decode(got, skip_special_tokens=True)
        assert reason == ("eos" if got[-1] == tok.eos_token_id else "length")
    assert out["target_forwards"] == out["rounds"] + 1 and out["drafter_forwards"] == 0
    assert out["block_size"] == (block or 8) and len(out["acceptance_by_position"]) == out["block_size"] - 1
    assert out["accepted_per_round"] == pytest.approx(out["tau"] - 1, abs=1e-3)
    for key in ("tokens_per_second", "wall_time_s", "generated_tokens", "acceptance"):
        assert key in out


def test_spec_with_a_dflash_drafter_directory(capsys, target_dir, tmp_path):
    from dllm.drafters.dflash.io import random_dflash, save_dflash

    directory, model, tok = target_dir
    save_dflash(random_dflash(model.config, 1, block_size=4, mask_token_id=31), tmp_path)
    out = _run_json(capsys, ["spec", "--target", str(directory), "--drafter", f"dflash:model={tmp_path}", "--prompt",
                             *PROMPTS[1:], "--max-new-tokens", "16"])
    assert out["block_size"] == 4 and out["drafter_forwards"] >= out["rounds"] > 0
    for prompt, got in zip(PROMPTS[1:], out["generated"]):
        ids = torch.tensor([tok.encode(prompt)])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
        assert got == ref[0, ids.shape[1]:].tolist()


def test_spec_prints_texts_and_a_summary(capsys, target_dir):
    directory, _, _ = target_dir
    assert main(["spec", "--target", str(directory), "--prompt", PROMPTS[0], "--max-new-tokens", "12"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 1  # one prompt: its text, unnumbered
    summary = captured.err.strip().splitlines()[-1]
    for part in ("tau ", "mean accepted drafts per round", "target forwards", "drafter forwards 0", "tokens/s", " s,"):
        assert part in summary, part


def test_spec_sampling_is_seeded_and_stop_strings_cut(capsys, target_dir):
    directory, _, _ = target_dir
    argv = ["spec", "--target", str(directory), "--prompt", PROMPTS[1], "--max-new-tokens", "16", "--temperature",
            "0.9", "--top-k", "8", "--top-p", "0.95", "--seed", "3", "--threads", "1"]
    first, again = _run_json(capsys, argv), _run_json(capsys, argv)
    assert first["generated"] == again["generated"]
    greedy = _run_json(capsys, ["spec", "--target", str(directory), "--prompt", PROMPTS[0], "--max-new-tokens", "24"])
    words = greedy["texts"][0].split()
    at = next(i for i, w in enumerate(words) if w != words[0])  # the first word that is not the first word
    assert at >= 2 and not any(words[at] in w for w in words[:at])
    cut = _run_json(capsys, ["spec", "--target", str(directory), "--prompt", PROMPTS[0], "--max-new-tokens", "24",
                             "--stop", "no-such-word", words[at]])
    assert cut["stop_reasons"] == ["stop"] and cut["texts"][0].split() == words[:at + 1]


def test_a_target_without_tokenizer_takes_token_ids(capsys, tmp_path):
    model, tok = _build(tmp_path, tokenizer=False)
    prompt = tok.encode(PROMPTS[0])
    out = _run_json(capsys, ["spec", "--target", str(tmp_path), "--prompt", " ".join(map(str, prompt)),
                             "--max-new-tokens", "10"])
    ids = torch.tensor([prompt])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10)
    assert out["generated"][0] == ref[0, len(prompt):].tolist()
    assert out["texts"][0] == " ".join(map(str, out["generated"][0]))
    assert main(["spec", "--target", str(tmp_path), "--prompt", "the cat"]) == 2
    assert "ships no tokenizer; give each --prompt as token ids" in capsys.readouterr().err


def test_drafters_lists_the_registered_drafters(capsys):
    assert main(["drafters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ngram = next(line for line in lines if line.startswith("ngram "))
    assert "Prompt lookup" in ngram and "aliases: prompt_lookup" in ngram
    assert any(line.startswith("dlm ") for line in lines)


@pytest.mark.parametrize("target,drafter,match", [
    (None, "nope", "Unknown drafter 'nope'. Valid drafters: "),
    (None, "ngram:colour=red", "Unknown option(s) 'colour' for drafter 'ngram'. Valid options: max_ngram, min_ngram"),
    (None, "ngram:max_ngram", "cannot parse drafter option 'max_ngram'; expected key=value"),
    (None, "ngram:max_ngram=0", "max_ngram"),
    (None, "dlm:model=tiny-random-llada", "has a vocabulary of 112 tokens but the target's logits have 32"),
    ("/no/such/dir", "ngram", "cannot load '/no/such/dir': no such local path"),
    ("tiny-random-llada", "ngram", "is not a transformers causal LM (architectures ['LLaDAModelLM']"),
])
def test_bad_input_is_exit_status_2_with_a_message(capsys, target_dir, target, drafter, match):
    target = str(target_dir[0]) if target is None else target
    argv = ["spec", "--target", target, "--drafter", drafter, "--prompt", PROMPTS[0], "--max-new-tokens", "4"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' progress bars, if any
    assert err.startswith("dllm spec: error: ") and match in err, err


@pytest.mark.parametrize("argv", [["--max-new-tokens", "0"], ["--block-size", "0"], []])
def test_argument_ranges_are_checked_by_argparse(capsys, target_dir, argv):
    prompt = [] if not argv else ["--prompt", "the cat"]  # no --prompt at all: required
    with pytest.raises(SystemExit) as exc:
        main(["spec", "--target", str(target_dir[0]), *prompt, *argv])
    assert exc.value.code == 2


@pytest.mark.slow
def test_spec_runs_as_a_command(target_dir):
    directory, model, tok = target_dir
    out = subprocess.run([sys.executable, "-m", "dllm.cli", "spec", "--target", str(directory), "--drafter", "ngram",
                          "--prompt", PROMPTS[0], "--max-new-tokens", "8", "--json"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    ids = torch.tensor([tok.encode(PROMPTS[0])])
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8)
    assert json.loads(out.stdout)["generated"][0] == ref[0, ids.shape[1]:].tolist()


def test_spec_with_a_draft_tree_on_the_embedded_pair(capsys):
    prompt = "[BOS] reverse_long " + " ".join("ABCDEFGHIJKLMNOP" * 2) + " [SEP]"
    base = ["spec", "--target", "tiny-ar", "--drafter", "dflash:model=tiny-ar-dflash", "--prompt", prompt,
            "--max-new-tokens", "33"]
    chain = _run_json(capsys, base)
    tree = _run_json(capsys, [*base, "--tree", "ddtree:budget=32"])
    assert tree["generated"] == chain["generated"] and tree["tau"] >= chain["tau"]
    assert main(["spec", "--target", "tiny-ar", "--drafter", "ngram", "--prompt", prompt, "--tree", "ddtree"]) == 2
    assert "returns tokens only" in capsys.readouterr().err


def test_spec_refuses_the_unknown_word_of_the_readme_example(capsys):
    """The README's example with a literal '...' (not a word of the task vocabulary) was decoded as the
    pad token and printed garbage; it is refused with the message dllm.generate gives."""
    prompt = "[BOS] copy_long A B C ... [SEP]"
    assert main(["spec", "--target", "tiny-ar", "--drafter", "dflash:model=tiny-ar-dflash", "--prompt", prompt,
                 "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("dllm spec: error: the prompt has 1 word(s) the tokenizer does not know: '...'"), err


def test_a_block_head_plan_takes_no_tree_flag(capsys):
    """``--block-size auto`` lets the drafter's block head pick each prompt's tree: ``--tree`` with it is
    refused (exit status 2) before anything loads."""
    argv = ["spec", "--target", "/no/such/dir", "--prompt", "the cat", "--block-size", "auto", "--tree", "ddtree"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dllm spec: error: --block-size auto (the drafter's block head) picks each prompt's tree")

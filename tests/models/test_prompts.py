"""generation_prompt: family chat templates (LLaDA-8B-Instruct, Dream-v0-Instruct-7B), raw prompts, word
tokenizer, unknown words; encode_prompts: the accepted prompt forms and integer token ids."""

import re
import warnings

import numpy as np
import pytest
import torch

import dllm
from dllm import tasks as T
from dllm.inputs import encode_prompts
from dllm.models import load, tiny
from dllm.models.text.tokenizer import build_word_tokenizer

LLADA_HI = ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
DREAM_HI = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def _ids(tok, *pieces):
    return [tok.get_vocab()[p] for p in pieces]


@pytest.mark.parametrize("source", ["tiny", "embedded"])
def test_llada_chat_template_exact(source):
    model = tiny("llada") if source == "tiny" else load("tiny-random-llada")
    assert model.render_chat([{"role": "user", "content": "Hi"}]) == LLADA_HI
    tok = model.tokenizer
    expected = _ids(tok, "<|startoftext|>", "<|start_header_id|>", "user", "<|end_header_id|>", "hi",
                    "<|eot_id|>", "<|start_header_id|>", "assistant", "<|end_header_id|>")
    assert model.generation_prompt("Hi", chat=True) == expected
    assert model.generation_prompt([{"role": "user", "content": "  Hi \n"}], chat=True) == expected  # trimmed


def test_llada_template_multi_turn_bos_once_and_assistant_header_always():
    model = tiny("llada")
    text = model.render_chat([{"role": "system", "content": "be good"}, {"role": "user", "content": "hi"}])
    assert text.count("<|startoftext|>") == 1 and text.startswith("<|startoftext|><|start_header_id|>system")
    assert text.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("source", ["tiny", "embedded"])
def test_dream_chat_template_exact(source):
    model = tiny("dream") if source == "tiny" else load("tiny-random-dream")
    assert model.render_chat([{"role": "user", "content": "Hi"}]) == DREAM_HI
    tok = model.tokenizer
    expected = _ids(tok, "<|im_start|>", "system", "you", "are", "a", "helpful", "assistant", ".",
                    "<|im_end|>", "<|im_start|>", "user", "hi", "<|im_end|>", "<|im_start|>", "assistant")
    assert model.generation_prompt("Hi", chat=True) == expected
    own_system = model.render_chat([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert own_system == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_raw_prompt_and_errors():
    model = tiny("llada")
    tok = model.tokenizer
    assert model.generation_prompt("What is 12 ?") == _ids(tok, "what", "is", "1", "2", "?")
    with pytest.raises(ValueError, match="needs chat=True"):
        model.generation_prompt([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="has no tokenizer"):
        tiny("dream", tokenizer=False).generation_prompt("hi", chat=True)


@pytest.mark.parametrize("name,tokens", [
    ("tiny-llada", "'<|startoftext|>', '<|start_header_id|>', '<|end_header_id|>', '<|eot_id|>'"),
    ("tiny-dream", "'<|im_start|>', '<|im_end|>'"),
])
def test_chat_on_a_model_without_a_chat_template_names_the_model(name, tokens):
    """The embedded task models' word vocabularies ship no template and lack the family default's
    tokens: chat=True says so, naming the model (it used to list the template's pieces as unknown
    words)."""
    model = load(name)
    pattern = (rf"model '{name}' has no chat template: its tokenizer has none, and the {model.family} default "
               rf"template needs the tokens {re.escape(tokens)}, which its \d+-entry vocabulary lacks; pass "
               rf"chat=False and a raw prompt")
    with pytest.raises(ValueError, match=pattern):
        dllm.generate(model, "[BOS] copy A B [SEP]", gen_length=4, chat=True)
    with pytest.raises(ValueError, match=pattern):
        model.generation_prompt([{"role": "user", "content": "A"}], chat=True)
    assert dllm.generate(model, "[BOS] copy A B [SEP]", gen_length=4).nfe == 4  # chat=False works


def test_no_template_at_all_names_the_model(monkeypatch):
    model = load("tiny-random-llada")
    monkeypatch.setattr(model.tokenizer, "chat_template", None)
    monkeypatch.setattr(type(model), "default_chat_template", None)
    with pytest.raises(ValueError, match=r"model 'tiny-random-llada' has no chat template: its tokenizer has none and "
                                         r"family 'llada' defines no default; pass chat=False"):
        model.generation_prompt("hi", chat=True)
    model = tiny("dream")
    monkeypatch.setattr(model.tokenizer, "chat_template", None)
    monkeypatch.setattr(type(model), "default_chat_template", None)
    with pytest.raises(ValueError, match=r"this dream model has no chat template"):
        model.generation_prompt("hi", chat=True)


def test_tokenizer_template_takes_precedence():
    model = tiny("llada")
    model.tokenizer.chat_template = "{{ messages[0]['content'] }}!"
    assert model.render_chat([{"role": "user", "content": "hi"}]) == "hi!"
    model.tokenizer.chat_template = None
    assert model.render_chat([{"role": "user", "content": "Hi"}]) == LLADA_HI  # family default


def test_build_word_tokenizer_layout_and_errors():
    tok = build_word_tokenizer(["cat", "dog", "cat"], ["<eos>", "<mask>"], eos_token="<eos>", mask_token="<mask>")
    assert tok.get_vocab() == {"<unk>": 0, "<eos>": 1, "<mask>": 2, "cat": 3, "dog": 4}
    assert tok("Cat <mask> bird", add_special_tokens=False)["input_ids"] == [3, 2, 0]
    assert (tok.eos_token_id, tok.mask_token_id) == (1, 2)
    with pytest.raises(ValueError, match="eos_token '<end>' must be one of the specials"):
        build_word_tokenizer(["a"], ["<eos>"], eos_token="<end>")
    with pytest.raises(ValueError, match="without whitespace"):
        build_word_tokenizer(["two words"], [])


def test_unknown_words_are_an_error_naming_them():
    model = load("tiny-llada")  # the task vocabulary: items A-P are upper case, unknown words were [PAD]
    pattern = r"does not know: 'a', 'b'; .*unknown token '\[PAD\]' \(id 0\), which is also its pad .*'a' -> 'A'"
    with pytest.raises(ValueError, match=pattern):
        model.generation_prompt("[BOS] copy a b a [SEP]")
    with pytest.raises(ValueError, match=pattern):
        encode_prompts(model, ["[BOS] copy A B [SEP]", "[BOS] copy a b [SEP]"])
    with pytest.raises(ValueError, match=pattern):
        dllm.generate(model, "[BOS] copy a b [SEP]", gen_length=4)
    words = ["[BOS]", "copy", "A", "B", "[SEP]"]
    assert model.generation_prompt(" ".join(words)) == [T.word_id(w) for w in words]
    small = tiny("dream")  # a dedicated <unk>: a real token, so a warning names the words (as typed)
    tok = small.tokenizer
    with pytest.warns(UserWarning, match=r"does not know: 'Zebra'; .*unknown token '<unk>' \(id 0\)\."):
        assert small.generation_prompt("a Zebra ?") == _ids(tok, "a", "<unk>", "?")
    with pytest.warns(UserWarning, match="'Zebra'"):
        small.generation_prompt("what is a Zebra ?", chat=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the unknown token typed on purpose is not an unknown word
        assert small.generation_prompt("hi <unk>") == _ids(tok, "hi", "<unk>")


@pytest.mark.parametrize("prompts", [
    [[7.5, 3]], [[7.0, 3]], [[3, np.float32(2.0)]], [[True, 3]], [[3, torch.tensor(True)]],
    torch.tensor([[7.5, 3.0]]), torch.tensor([True, False]),
], ids=["float", "integral-float", "numpy-float", "bool", "bool-tensor", "float-tensor", "bool-tensor-row"])
def test_float_or_bool_token_ids_are_an_error(prompts):
    model = tiny("llada")
    with pytest.raises(ValueError, match="integer"):
        encode_prompts(model, prompts)
    with pytest.raises(ValueError, match="integer"):
        dllm.generate(model, prompts, gen_length=4)


def test_token_ids_of_any_integer_type():
    model = tiny("llada")
    assert encode_prompts(model, [[np.int64(5), torch.tensor(6), 7], (8, 9)]) == [[5, 6, 7], [8, 9]]
    assert encode_prompts(model, torch.tensor([5, 6], dtype=torch.int32)) == [[5, 6]]

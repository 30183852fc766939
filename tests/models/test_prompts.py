"""generation_prompt: family chat templates (formats.md 1.7 and 2.7), raw prompts, word tokenizer."""

import pytest

from dllm.models import load, tiny
from dllm.models.tokenizer import build_word_tokenizer

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

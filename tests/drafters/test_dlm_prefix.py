"""The dlm drafter serves a target whose vocabulary extends the drafter's (appended words), and
refuses one whose shared ids mean other words."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from dllm.drafters.base import make_drafter
from dllm.drafters.loop import speculative_generate
from dllm.drafters.plan import Plan
from dllm.models import load
from dllm.models.text.task_tokenizer import task_tokenizer


def target88():
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=88, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return Qwen3ForCausalLM(cfg).eval()


def test_prefix_vocabulary_drafts_losslessly():
    llada = load("tiny-llada")  # 80 words: the task vocabulary before the long-answer tokens
    target, tok = target88(), task_tokenizer()  # 83 words, ids 80-82 unknown to the drafter
    prompt = [[2, 80, 60, 61, 62, 81, 3]]  # ids >= 80 are read as the drafter's pad
    drafter = make_drafter("dlm", model=llada)
    out = speculative_generate(target, drafter, prompt, max_new_tokens=12, plan=4, tokenizer=tok,
                               eos_token_id=[])
    ref = target.generate(torch.tensor(prompt), max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert out.generated[0] == ref[0, 7:].tolist()
    assert drafter.context([2, 80, 1, 61], 3) == [2, llada.pad_id, llada.pad_id, 61]


def test_a_prefix_vocabulary_without_the_tokenizer_says_to_pass_it():
    """A shorter drafter vocabulary is served when the tokenizers show it is a prefix; a call without the
    target's tokenizer was told drafter and target 'must share the tokenizer and vocabulary', as if the
    pair could never run (it does with tokenizer=...)."""
    drafter = make_drafter("dlm", model=load("tiny-llada"))
    with pytest.raises(ValueError, match=r"vocabulary of 80 tokens but the target's logits have 88; a shorter "
                                         r"vocabulary serves only when it is a prefix .*pass the target's tokenizer"):
        speculative_generate(target88(), drafter, [[2, 5, 3]], max_new_tokens=4)


def test_prefix_with_other_words_is_refused():
    from dllm.models.text.tokenizer import build_word_tokenizer

    llada = load("tiny-llada")
    words = [f"w{i}" for i in range(78)]
    other = build_word_tokenizer(words, ["[PAD]", "[MASK]", "[BOS]", "[SEP]", "[EOS]"], unk_token="[PAD]",
                                 bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", mask_token="[MASK]",
                                 chat_template=None, lowercase=False, split_digits=False)
    with pytest.raises(ValueError, match="tokenizer differs from the target's"):
        speculative_generate(target88(), make_drafter("dlm", model=llada), [[2, 5, 3]], max_new_tokens=4,
                             tokenizer=other)


def test_dlm_marginals_build_lossless_draft_trees():
    llada = load("tiny-llada")
    target, tok = target88(), task_tokenizer()
    prompts = [[2, 80, 60, 61, 62, 81, 3], [2, 5, 3]]
    plain = make_drafter("dlm", model=llada)
    with pytest.raises(ValueError, match="returns tokens only"):
        speculative_generate(target, plain, prompts, max_new_tokens=6, plan=Plan(block_size=4, tree="ddtree:budget=6"),
                             tokenizer=tok)
    drafter = make_drafter("dlm", model=llada, marginals=True)
    logits = drafter.marginal_logits([[2, 5, 3], [2, 7]], 3)
    assert logits.shape == (2, 3, 80) and torch.isinf(logits[..., llada.mask_id]).all()
    out = speculative_generate(target, drafter, prompts, max_new_tokens=10,
                               plan=Plan(block_size=4, tree="ddtree:budget=6"), tokenizer=tok, eos_token_id=[])
    for row, prompt in zip(out.generated, prompts):
        ref = target.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, min_new_tokens=10)
        assert row == ref[0, len(prompt):].tolist()
    assert out.drafter_forwards >= 2 * (out.target_forwards - 1)  # the sampler's step + the marginals forward

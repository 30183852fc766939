"""Greedy speculative decoding with our drafter, driven by a minimal loop written here (batch 1), is
token-identical to the reference package's ``dflash_generate`` and to ``target.generate``, and drafts
the same logits round by round. (The production loop lives in dllm.drafters and is tested there.)"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from dllm.drafters.dflash.io import random_dflash, save_dflash
from dllm.drafters.dflash.model import (DraftKVCache, draft_block, extract_context_feature, make_block,
                                        target_embedding, target_head)
from dllm.drafters.target import crop_to

VOCAB, MASK = 13, 12



@torch.no_grad()
def greedy_dflash(drafter, target, ids: torch.Tensor, max_new_tokens: int):
    """(sequence [1, P + new], per-round draft logits, per-round tokens committed)."""
    prompt_len, size = ids.shape[1], drafter.block_size
    max_len = prompt_len + max_new_tokens
    target_cache = DynamicCache(config=target.config)
    out = target(ids, past_key_values=target_cache, use_cache=True, output_hidden_states=True)
    seq = torch.cat([ids, out.logits[:, -1:].argmax(-1)], dim=1)  # the first token, the first anchor
    features = extract_context_feature(out.hidden_states, drafter.target_layer_ids)
    cache, drafts, committed = DraftKVCache(drafter.config.num_layers), [], []
    start = prompt_len
    while start + 1 < max_len:
        width = min(size, max_len - start)
        block = make_block(seq[:, start], width, drafter.mask_token_id)
        draft = draft_block(drafter, cache, features, block, embed_tokens=target_embedding(target),
                            lm_head=target_head(target))
        block[:, 1:] = draft.tokens
        drafts.append(draft.logits)
        out = target(block, position_ids=torch.arange(start, start + width)[None], past_key_values=target_cache,
                     use_cache=True, output_hidden_states=True)
        posterior = out.logits.argmax(-1)  # [1, width]
        accepted = int((block[:, 1:] == posterior[:, :-1]).cumprod(dim=1).sum())
        produced = min(accepted + 1, max_len - start - 1)
        seq = torch.cat([seq[:, :start], block[:, :accepted + 1], posterior[:, accepted:accepted + 1]], dim=1)
        start += produced
        crop_to(target_cache, start)  # the bonus token has no K/V yet: it anchors the next block
        features = extract_context_feature(out.hidden_states, drafter.target_layer_ids)[:, :produced]
        committed.append(produced)
    return seq[:, :min(start + 1, max_len)], drafts, committed


NEEDS_REFERENCE = "the reference package `dflash` is not installed (pip install --no-deps dflash==0.1.0)"
CASES = [(4, 40), (6, 23)]  # (block size, new tokens): the last round of the second case is cut short


def pair(block_size: int):
    """A tiny random Qwen3 target and a random drafter for it (weights perturbed away from the init)."""
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.1)
    target = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # one dominant hidden dimension: the arg-max is mostly one of two tokens, so
        u = torch.randn(VOCAB, generator=torch.Generator().manual_seed(7))  # random drafts are often accepted
        target.lm_head.weight[:, 0] += 3.0 * u
    drafter = random_dflash(cfg, 2, block_size, MASK, seed=2)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return target, drafter


PROMPT = torch.randint(0, MASK, (1, 9), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("block_size, max_new", CASES)
def test_greedy_loop_equals_target_generate(block_size, max_new):
    target, drafter = pair(block_size)
    ours, _, committed = greedy_dflash(drafter, target, PROMPT, max_new)
    plain = target.generate(PROMPT, max_new_tokens=max_new, do_sample=False, min_new_tokens=max_new)
    assert torch.equal(ours, plain)
    assert max(committed) > 1  # some rounds accepted drafts, so the cache took several tokens at once
    assert sum(committed) == max_new - 1  # + the prefill's token


@pytest.mark.parametrize("block_size, max_new", CASES)
def test_greedy_loop_matches_reference_dflash_generate(block_size, max_new, tmp_path):
    reference = pytest.importorskip("dflash.model", reason=NEEDS_REFERENCE)
    target, drafter = pair(block_size)
    save_dflash(drafter, tmp_path)
    ref = reference.DFlashDraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    theirs_drafts: list[torch.Tensor] = []
    compute_logits = ref.compute_logits
    ref.compute_logits = lambda hidden, head: theirs_drafts.append(compute_logits(hidden, head)) or theirs_drafts[-1]

    ours, our_drafts, _ = greedy_dflash(drafter, target, PROMPT, max_new)
    theirs = reference.dflash_generate(ref, target, PROMPT, max_new, None)
    assert torch.equal(ours, theirs)
    assert len(our_drafts) == len(theirs_drafts)
    for r, (a, b) in enumerate(zip(our_drafts, theirs_drafts)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"round {r}")

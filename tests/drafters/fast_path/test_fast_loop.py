"""The batch-1 fast path (``fast_loop.FastRun`` on ``StaticTarget`` / ``StaticDraft``) against the
general loop (``fast_path=False``): the same tokens, the same acceptance round by round, the same
forwards; its target forward equals transformers' own, and its DFlash drafts equal ``draft_block``'s."""

from __future__ import annotations

import pytest
import torch

from dllm.drafters.dflash.cache import DraftKVCache
from dllm.drafters.dflash.io import random_dflash
from dllm.drafters.dflash.model import draft_block, make_block, target_embedding, target_head
from dllm.drafters.dflash.static_draft import StaticDraft, static_draft_issue
from dllm.drafters.fast_path.fast_loop import FastRun, fast_path_issue
from dllm.drafters.loop import speculative_generate
from dllm.drafters.fast_path.static_target import StaticTarget, static_target_issue
from tests.drafters.speculative_helpers import OracleDrafter, hf_greedy, long_answer_prompts, tiny_target


def both(target, drafter, prompt, **kw):
    fast = speculative_generate(target, drafter, [prompt], **kw)
    ref = speculative_generate(target, drafter, [prompt], fast_path=False, **kw)
    return fast, ref


def same_run(fast, ref) -> None:
    assert fast.generated == ref.generated
    assert fast.acceptance == ref.acceptance  # round by round
    assert fast.stop_reasons == ref.stop_reasons
    assert (fast.rounds, fast.target_forwards, fast.drafter_forwards) == \
        (ref.rounds, ref.target_forwards, ref.drafter_forwards)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_static_forward_equals_transformers_forward(kind):
    """Prefill then two blocks (the second overwriting a rejected tail): logits and every tapped layer
    (the last one is transformers' final-norm output) equal the model's own forward with a cache."""
    from transformers import DynamicCache

    target = tiny_target(kind, layers=3)
    taps = (0, 2)
    gen = torch.Generator().manual_seed(0)
    prompt, block, block2 = (torch.randint(3, 100, (1, n), generator=gen) for n in (11, 6, 5))
    static = StaticTarget(target, taps, 40)
    cache = DynamicCache(config=target.config)
    with torch.inference_mode():
        for ids, start in [(prompt, 0), (block, 11), (block2, 13)]:  # block2 replaces block's last 4 slots
            if cache.get_seq_length() > start:
                cache.crop(start - cache.get_seq_length())
            logits, hidden = static.forward(ids, start)
            pos = torch.arange(start, start + ids.shape[1])[None]
            out = target(ids, past_key_values=cache, use_cache=True, position_ids=pos, output_hidden_states=True)
            assert torch.equal(logits, out.logits)
            assert torch.equal(hidden, torch.cat([out.hidden_states[i + 1] for i in taps], dim=-1))


def test_fast_path_is_token_and_acceptance_equal_on_the_shipped_pair(tiny_pair):
    target, tok, drafter = tiny_pair
    _, ids = long_answer_prompts(tok)
    for prompt in ids:
        fast, ref = both(target, drafter, prompt, max_new_tokens=66, tokenizer=tok)
        same_run(fast, ref)
        assert fast.tau > 2.0


def test_fast_path_at_temperature_draws_what_the_general_loop_draws(tiny_pair):
    """T > 0 with a seed: the same random draws in the same order over the same numbers."""
    target, tok, drafter = tiny_pair
    _, ids = long_answer_prompts(tok)
    for prompt in ids[:4]:
        fast, ref = both(target, drafter, prompt, max_new_tokens=40, temperature=1.0, seed=3)
        same_run(fast, ref)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("block, max_new", [(4, 30), (6, 17), (1, 9)])
def test_fast_path_equals_greedy_with_any_drafter(kind, block, max_new):
    """Random targets (GQA, no q/k norms for Llama), ragged acceptance, the trimmed last block, B = 1."""
    target = tiny_target(kind)
    drafter = OracleDrafter(target, wrong_every=3)
    prompt = [5, 9, 14, 3, 8, 21, 7]
    fast, ref = both(target, drafter, prompt, max_new_tokens=max_new, plan=block)
    same_run(fast, ref)
    assert fast.generated[0] == hf_greedy(target, prompt, max_new)


def test_the_draft_buffer_drafts_what_draft_block_drafts():
    """StaticDraft over three rounds (prompt features, then accepted runs) equals draft_block with a
    DraftKVCache, logits bit for bit."""
    target = tiny_target("qwen3", layers=4, vocab=112)
    drafter = random_dflash(target.config, 2, 8, 111, seed=1)
    static, cache = StaticDraft(drafter), DraftKVCache(drafter.config.num_layers)
    gen = torch.Generator().manual_seed(2)
    width = 2 * target.config.hidden_size
    start = 0
    for n in (9, 3, 5):
        feats = torch.randn((1, n, width), generator=gen)
        block = make_block(torch.tensor([7 + n]), 8, 111)
        kw = dict(embed_tokens=target_embedding(target), lm_head=target_head(target))
        ref = draft_block(drafter, cache, feats, block, feature_positions=torch.arange(start, start + n)[None],
                          block_positions=torch.arange(start + n, start + n + 8)[None], **kw)
        out = static.draft(feats, block, target_embedding(target), target_head(target))
        assert torch.equal(out.logits, ref.logits) and torch.equal(out.tokens, ref.tokens)
        start += n


def test_the_draft_buffer_grows():
    target = tiny_target("qwen3", layers=4, vocab=112)
    drafter = random_dflash(target.config, 2, 4, 111, seed=1)
    static = StaticDraft(drafter)
    feats = torch.randn((1, 300, 2 * target.config.hidden_size))
    static.draft(feats, make_block(torch.tensor([3]), 4, 111), target_embedding(target), target_head(target))
    assert static.capacity >= 304 and static.stored == 300


def test_who_takes_the_fast_path(tiny_pair):
    target, _, drafter = tiny_pair
    assert fast_path_issue(target, 1, None, None) is None
    assert "batch 1" in fast_path_issue(target, 2, None, None)
    assert "tree" in fast_path_issue(target, 1, object(), None)
    assert static_draft_issue(drafter.model) is None
    target.config._attn_implementation = "eager"
    try:
        assert "sdpa" in static_target_issue(target)
    finally:
        target.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="StaticTarget cannot run"):
        StaticTarget(torch.nn.Linear(2, 2), (), 8)


def test_a_batch_takes_the_general_loop(tiny_pair, monkeypatch):
    target, tok, drafter = tiny_pair
    _, ids = long_answer_prompts(tok)
    made = []
    monkeypatch.setattr(FastRun, "prefill", lambda self: made.append(self) or pytest.fail("FastRun ran a batch"))
    out = speculative_generate(target, drafter, ids[:2], max_new_tokens=8)
    assert not made and len(out.generated) == 2


def test_fast_path_flag_must_be_a_bool(tiny_pair):
    target, tok, drafter = tiny_pair
    with pytest.raises((TypeError, ValueError), match="fast_path"):
        speculative_generate(target, drafter, [[5, 6, 7]], max_new_tokens=2, fast_path="yes")


def test_the_fast_path_streams_every_round(tiny_pair):
    """callback= sees the same growing rows on both paths (a server streams from it)."""
    target, tok, drafter = tiny_pair
    _, ids = long_answer_prompts(tok)
    seen: dict[bool, list] = {True: [], False: []}
    for fast in (True, False):
        speculative_generate(target, drafter, [ids[0]], max_new_tokens=40, fast_path=fast,
                             callback=lambda rows, f=fast: seen[f].append([list(r) for r in rows]))
    assert seen[True] == seen[False] and len(seen[True]) >= 2


def test_adapted_projections_keep_the_general_path():
    """A projection that is not a plain nn.Linear (quantized, LoRA-wrapped) may compute anything: the
    fused static weights would skip it, so neither static path takes such a model."""

    class Wrapped(torch.nn.Linear):
        pass

    target = tiny_target("qwen3")
    old = target.model.layers[0].self_attn.k_proj
    target.model.layers[0].self_attn.k_proj = Wrapped(old.in_features, old.out_features, bias=False)
    assert "nn.Linear" in static_target_issue(target)
    assert "nn.Linear" in fast_path_issue(target, 1, None, None)
    drafter = random_dflash(tiny_target("qwen3", layers=4, vocab=112).config, 2, 4, 111, seed=1)
    old = drafter.layers[1].self_attn.v_proj
    drafter.layers[1].self_attn.v_proj = Wrapped(old.in_features, old.out_features, bias=False)
    assert "nn.Linear" in static_draft_issue(drafter)


def test_one_token_rounds_equal_target_generate_at_a_near_tie(tiny_pair):
    """Block size 1 runs one-row forwards. On the 36th long-answer prompt (reverse_long) tiny-ar's two best
    tokens at answer position 41 are 2e-5 apart: a fused q/k/v (or gate/up) matrix-vector product rounds
    differently from transformers' separate ones and flipped it, so one-row forwards run those."""
    from dllm import tasks as T
    from dllm.drafters.base import make_drafter
    from dllm.models.text.task_tokenizer import task_tokenizer

    target = tiny_pair[0]
    ex = [e for t in ("copy_long", "double_long", "reverse_long") for s in T.get_task(t).default_sizes
          for e in T.test_split(t, s, n=4)][35]
    prompt, budget = T.prompt_ids(ex), T.answer_length(ex.task, ex.size)
    want = target.generate(torch.tensor([prompt]), max_new_tokens=budget, do_sample=False)[0, len(prompt):].tolist()
    got = speculative_generate(target, make_drafter("ngram"), [prompt], max_new_tokens=budget, temperature=0.0,
                               plan=1, tokenizer=task_tokenizer())
    assert list(got.generated[0]) == want

"""Shared builders for the drafter tests: tiny random transformers targets, their reference greedy
output, and test-only drafters (never registered, so the registry holds only real drafters).

The tests (here and in the sub-folders mirroring ``dllm/drafters``: ``dflash/``, ``fast_path/``,
``trees/``) import it as ``tests.drafters.speculative_helpers``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from dllm.drafters.base import Draft, DraftContext, Drafter

VOCAB = 112  # = dllm.models.tiny("llada").vocab_size, so a tiny LLaDA can draft for these targets
EOS, PAD = 2, 0


def tiny_target(kind: str = "qwen3", *, vocab: int = VOCAB, seed: int = 0, eos: Optional[int] = EOS,
                layers: int = 2, hidden: int = 64, init: float = 0.5, **extra):
    """A small random Qwen3 / Llama causal LM (float32, eval). ``init`` is the weight std: 0.5 makes
    the logits peaked (few near-ties, outputs that loop, so n-gram drafts get accepted)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=512,
                  eos_token_id=eos, pad_token_id=PAD, bos_token_id=1, initializer_range=init,
                  tie_word_embeddings=False, **extra)
    cls = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[kind]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls[1](cls[0](**common))
    return model.float().eval()


def hf_greedy(target, prompt: list[int], max_new_tokens: int, eos: Optional[int] = EOS) -> list[int]:
    """transformers' own greedy continuation of one prompt (no padding): the ground truth."""
    ids = torch.tensor([prompt])
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                          eos_token_id=eos, pad_token_id=PAD)
    return out[0, len(prompt):].tolist()


class OracleDrafter(Drafter):
    """Drafts the target's own greedy continuation (computed without a cache), so every draft is
    accepted; ``wrong_every=n`` corrupts draft i of row r where (i + r + round) % n == 0, giving
    ragged acceptance across rows and rounds. ``taps`` declares target layers (their features are
    recorded in ``self.seen`` for the hidden-state tests)."""

    def __init__(self, target, *, wrong_every: int = 0, taps: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.target, self.wrong_every, self.taps = target, wrong_every, taps
        self.seen: list[DraftContext] = []

    @property
    def target_layers(self) -> tuple[int, ...]:
        return self.taps

    def propose(self, ctx: DraftContext) -> Draft:
        self.seen.append(dataclasses.replace(ctx, tokens=[list(t) for t in ctx.tokens]))  # the lists are live
        k = ctx.num_draft
        drafts = torch.empty((len(ctx.tokens), k), dtype=torch.long)
        by_length: dict[int, list[int]] = {}
        for r, seq in enumerate(ctx.tokens):
            by_length.setdefault(len(seq), []).append(r)
        for rows in by_length.values():  # rows of one length share batched cache-free forwards
            x = torch.tensor([ctx.tokens[r] for r in rows])
            with torch.no_grad():
                for _ in range(k):
                    x = torch.cat([x, self.target(x).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            drafts[rows] = x[:, x.shape[1] - k:]
        if self.wrong_every:
            i = torch.arange(k)[None, :]
            r = torch.arange(len(ctx.tokens))[:, None]
            drafts = torch.where((i + r + ctx.round) % self.wrong_every == 0, (drafts + 1) % self.target.config.vocab_size, drafts)
        return Draft(tokens=drafts, forwards=k)


class TableDrafter(Drafter):
    """A full-distribution drafter for the T > 0 tests: q(. | previous token) = softmax(table[prev])
    from a fixed random table, sampled with the call's generator (``one_hot=True``: the arg-max of
    q, returned without probabilities)."""

    def __init__(self, vocab: int, *, seed: int = 1, scale: float = 1.5, one_hot: bool = False) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.randn((vocab, vocab), generator=gen) * scale  # [V, V] logits by previous token
        self.one_hot = one_hot

    def propose(self, ctx: DraftContext) -> Draft:
        prev = ctx.anchor.cpu()  # [R]
        toks, probs = [], []
        for _ in range(ctx.num_draft):
            q = self.table[prev].softmax(dim=-1)  # [R, V]
            if self.one_hot:
                nxt = q.argmax(dim=-1)
            else:
                nxt = torch.multinomial(q, 1, generator=ctx.generator).squeeze(1)
            toks.append(nxt)
            probs.append(q)
            prev = nxt
        tokens = torch.stack(toks, dim=1)  # [R, K]
        return Draft(tokens=tokens, probs=None if self.one_hot else torch.stack(probs, dim=1))


def tv_distance(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total-variation distance between an empirical histogram and a distribution (same cells)."""
    freq = counts.double() / counts.sum()
    return 0.5 * float((freq - probs.double()).abs().sum())


def null_tv(probs: torch.Tensor, n: int) -> float:
    """Expected TV of n exact samples from ``probs`` (normal approximation per cell:
    E|freq - p| = sqrt(2 p (1 - p) / (pi n))): the sampling noise a correct sampler shows."""
    p = probs.double()
    return 0.5 * float(torch.sqrt(2 * p * (1 - p) / (torch.pi * n)).sum())


def dflash_target(vocab: int = 101, seed: int = 0):
    """The tiny Qwen3 target of the DFlash model/IO tests: hidden 64, 6 layers, GQA 4/2, head_dim
    16; the last id (vocab - 1) is left for the drafter's mask token."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.1)
    return Qwen3ForCausalLM(cfg).eval()


def long_answer_prompts(tok, per_size: int = 1):
    """(examples, prompt ids) of the first ``per_size`` test instances of every long-answer task."""
    from dllm import tasks as T

    vocab = tok.get_vocab()
    exs = [ex for name in T.suite_task_names("long-answer") for ex in T.test_split(name, None, n=per_size)]
    return exs, [[vocab[w] for w in T.prompt_words(ex)] for ex in exs]

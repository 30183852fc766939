"""Log-likelihoods of a masked diffusion model: LLaDA's Monte-Carlo estimate of the ELBO.

A masked diffusion model has no exact ``log p(answer | context)``; LLaDA (arXiv 2502.09992,
Appendix B.5; ML-GSAI/LLaDA ``get_log_likelihood.py`` and ``eval_llada.py``) estimates the lower
bound

    log p(a | c) >= E_{l ~ U{1..T}} E_{M: |M| = l} [ (T / l) * sum_{i in M} log p(a_i | c, a with M masked) ]

for an answer of T tokens. One Monte-Carlo batch holds b copies of ``c | a``:

1. draw k uniform in [1, T];
2. copy j masks ``l_j`` answer tokens, ``l = round(linspace(k, k + (b - 1) T / b, b))`` wrapped into
   [1, T] (``mask_counts``: the b counts cover [1, T] evenly, a low-discrepancy draw of l);
3. the ``l_j`` positions are a uniform random subset of the answer (``random_masks``);
4. batch loss = ``sum_j sum_{i masked} CE_ij * T / l_j / b`` (``weighted_nll``; upstream divides by
   the mask ratio ``p_mask = l_j / T``).

The estimate is minus the mean batch loss over ``mc_num / b`` batches. With classifier-free guidance
(``cfg_scale > 0``) the logits are LLaDA's ``un + (s + 1)(cond - un)``, the unconditional copy having
the context masked. A one-token answer is estimated exactly by one forward (every draw masks it).

The greedy check (lm-eval's ``is_greedy``) is upstream's ``suffix_greedy_prediction``: starting
from the context and T masks, commit the single most confident masked position per step, T steps;
the answer is greedy when that reproduces it. Here it is ``dllm.generate`` with ``low_confidence``
at one token per step, one block (a block-causal model: its trained block grid), batched over
requests with the same answer length (and, block-causal, the same context offset in the grid).

Families: ``DiffusionLM.forward`` returns logits where ``[:, i]`` predicts position i for every
family (Dream's one-position shift is undone inside its wrapper), so the same estimator is the ELBO
of a Dream model too, provided the context is not empty (Dream predicts position i from position
i - 1; the harness always gives at least a BOS/EOS token).
A block-causal model (SDAR, Fast-dLLM v2) gets the block-diffusion
bound instead: the sum over its grid blocks of the same estimate of each block's answer tokens given
the clean sequence before them (``MonteCarloLikelihood.estimate``).

Randomness: each request draws from its own ``torch.Generator`` seeded by ``request_seed(seed,
context, answer)`` on the CPU, so an estimate does not depend on the order of the requests, on
batching or on which data-parallel rank computes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dllm.inputs import model_device
from dllm.options import check_int, check_number


def mask_counts(k: int, b: int, t: int) -> torch.Tensor:
    """[b] int64 in [1, t]: LLaDA's stratified mask counts ``round(linspace(k, k + (b - 1) t / b, b))``
    wrapped into [1, t] (``((x - 1) mod t) + 1``), for a draw k in [1, t]."""
    x = torch.round(torch.linspace(float(k), k + (b - 1) * (t / b), steps=b)).long()  # [b]
    return (x - 1) % t + 1


def random_masks(counts: torch.Tensor, t: int, generator: torch.Generator) -> torch.Tensor:
    """[b, t] bool: row j masks ``counts[j]`` positions, a uniform random subset (the ranks of
    i.i.d. uniforms form a uniform random permutation per row)."""
    b = counts.shape[0]
    ranks = torch.rand(b, t, generator=generator).argsort(dim=1).argsort(dim=1)  # [b, t]
    return ranks < counts[:, None]


def weighted_nll(logits: torch.Tensor, target: torch.Tensor, masked: torch.Tensor,
                 counts: torch.Tensor) -> torch.Tensor:
    """One Monte-Carlo batch's loss: ``sum_j sum_{i masked} CE_ij * t / counts_j / b``.

    logits [b, t, V] (answer positions), target [t] long, masked [b, t] bool, counts [b] long.
    Returns a float32 scalar."""
    b, t, _ = logits.shape
    logp = torch.log_softmax(logits.float(), dim=-1)  # [b, t, V]
    nll = -logp.gather(-1, target.expand(b, t)[..., None]).squeeze(-1)  # [b, t]
    per_row = (nll * masked).sum(dim=1) * (t / counts.to(nll.dtype))  # [b]
    return per_row.sum() / b


def request_seed(seed: int, context: Sequence[int], answer: Sequence[int]) -> int:
    """A 63-bit seed from (seed, context ids, answer ids): stable across runs, machines and ranks."""
    text = f"{seed}|{','.join(map(str, context))}|{','.join(map(str, answer))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def guided_answer_logits(model, x: torch.Tensor, context_length: int, cfg_scale: float,
                         guide_length: Optional[int] = None) -> torch.Tensor:
    """Logits [b, T, V] of the answer columns ``x[:, context_length:]`` for canvases x [b, L]
    (no padding). ``cfg_scale > 0``: LLaDA's guidance, the unconditional copy with its first
    ``guide_length`` tokens (default: the context) masked."""
    if cfg_scale > 0:
        un = x.clone()
        un[:, :context_length if guide_length is None else guide_length] = model.mask_id
        cond_logits, un_logits = model(torch.cat([x, un])).logits[:, context_length:].chunk(2, dim=0)
        return un_logits + (cfg_scale + 1) * (cond_logits - un_logits)
    return model(x).logits[:, context_length:]


@dataclass(frozen=True)
class LikelihoodConfig:
    mc_num: int = 128  # Monte-Carlo samples (masked copies) per request; upstream: 128, 1 for one-token answers
    batch_size: int = 8  # at most this many copies per forward: b = the largest divisor of mc_num <= it
    cfg_scale: float = 0.0  # classifier-free guidance as in LLaDA (0: off)
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("mc_num", self.mc_num, 1)
        check_int("batch_size", self.batch_size, 1)
        check_number("cfg_scale", self.cfg_scale, low=0.0, finite=True)
        check_int("seed", self.seed, 0)

    @property
    def mc_batch(self) -> int:
        """b: copies per forward, the largest divisor of ``mc_num`` that is at most ``batch_size`` (so
        exactly ``mc_num`` samples are drawn in ``mc_num / b`` stratified batches)."""
        return max(d for d in range(1, min(self.batch_size, self.mc_num) + 1) if self.mc_num % d == 0)


class MonteCarloLikelihood:
    """LLaDA's estimate of ``log p(answer | context)`` and the greedy check (module docstring)."""

    def __init__(self, config: LikelihoodConfig) -> None:
        self.config = config

    @torch.no_grad()
    def estimate(self, model, context: Sequence[int], answer: Sequence[int]) -> float:
        """The Monte-Carlo ELBO of ``answer`` after ``context`` (token ids; 0.0 for an empty answer).
        A block-causal model (SDAR, Fast-dLLM v2): the block-diffusion bound (BD3-LM, arXiv
        2503.09573, eq. 8), the sum over the model's grid blocks of each block's answer tokens
        estimated as above given the clean sequence before them (the sequence cut at the block's
        end: block-causal attention never lets a block see later ones)."""
        from dllm.cache.block_causal import block_size_of

        bs = block_size_of(model)
        if bs is None or len(answer) == 0:
            return self._estimate(model, context, answer, len(context))
        seq, start, total = [*context, *answer], len(context), 0.0
        while start < len(seq):
            end = min((start // bs + 1) * bs, len(seq))  # the end of the grid block holding position start
            total += self._estimate(model, seq[:start], seq[start:end], len(context))
            start = end
        return total

    def _estimate(self, model, context: Sequence[int], answer: Sequence[int], guide_length: int) -> float:
        """``estimate`` of one span: the answer's tokens masked together after ``context``; guidance
        masks the first ``guide_length`` tokens (the request's context) in its unconditional copy."""
        cfg = self.config
        t = len(answer)
        if t == 0:
            return 0.0
        if len(context) == 0 and int(getattr(model, "logit_shift", 0)) > 0:
            raise ValueError(f"a {getattr(model, 'family', 'shifted')} model predicts position i from "
                             f"position i - 1: the likelihood needs at least one context token (a BOS)")
        device = model_device(model)
        seq = torch.tensor([*context, *answer], dtype=torch.long, device=device)  # [L]
        target = seq[len(context):]  # [t]
        b = cfg.mc_batch
        batches = cfg.mc_num // b
        if t == 1:  # every draw masks the one token with weight 1: one forward is exact
            b, batches = 1, 1
        generator = torch.Generator().manual_seed(request_seed(cfg.seed, context, answer))
        total = torch.zeros((), device=device)  # summed on the device: one host sync per request
        for _ in range(batches):
            k = int(torch.randint(1, t + 1, (), generator=generator))
            counts = mask_counts(k, b, t)  # [b]
            masked = random_masks(counts, t, generator)  # [b, t]
            x = seq.repeat(b, 1)  # [b, L]
            x[:, len(context):] = torch.where(masked.to(device), model.mask_id, target)
            logits = guided_answer_logits(model, x, len(context), cfg.cfg_scale, guide_length)  # [b, t, V]
            total += weighted_nll(logits, target, masked.to(device), counts.to(device))
        return -float(total) / batches

    @torch.no_grad()
    def greedy_matches(self, model, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                       max_batch: int) -> list[bool]:
        """For each (context, answer): does one-token-per-step confidence decoding of ``len(answer)``
        masks after the context reproduce the answer? Requests with the same answer length share
        ``generate`` calls of at most ``max_batch`` rows."""
        from dllm.cache.block_causal import block_size_of
        from dllm.engine import generate

        check_int("max_batch", max_batch, 1)
        bs = block_size_of(model)  # a block-causal model: its own block grid, shared by a batch's contexts
        out = [True] * len(pairs)  # an empty answer is trivially greedy
        by_length: dict[tuple[int, int], list[int]] = {}
        for i, (context, answer) in enumerate(pairs):
            if len(answer):
                by_length.setdefault((len(answer), len(context) % bs if bs else 0), []).append(i)
        for (t, _), idx in sorted(by_length.items()):
            for s in range(0, len(idx), max_batch):
                chunk = idx[s:s + max_batch]
                res = generate(model, [list(pairs[i][0]) for i in chunk], "low_confidence", gen_length=t,
                               block_length=None if bs else t, steps=None if bs else t,
                               cfg_scale=self.config.cfg_scale)
                for i, row in zip(chunk, res.generated.tolist()):
                    out[i] = row == list(pairs[i][1])
        return out


def rolling_windows(tokens: Sequence[int], prefix_token: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """(context, answer) windows that score every token of ``tokens`` exactly once.

    A text that fits (``1 + len(tokens) <= max_length``) is one window: the whole text after the
    prefix token, whose estimate is the ELBO of ``log p(tokens | prefix)``. A longer text is cut into
    answers of ``max_length // 2`` tokens, each after as many preceding tokens (prefix included) as
    fit in ``max_length``; the sum of their estimates approximates ``log p(tokens | prefix)`` the way
    lm-eval's rolling windows do for a causal model (each window bounds its conditional given a
    truncated context)."""
    check_int("max_length", max_length, 2)
    seq = [prefix_token, *tokens]
    if len(seq) <= max_length:
        return [([prefix_token], list(tokens))] if tokens else []
    step = max_length // 2
    out = []
    for s in range(1, len(seq), step):
        answer = seq[s:s + step]
        out.append((seq[max(0, s - (max_length - len(answer))):s], answer))
    return out


__all__ = ["LikelihoodConfig", "MonteCarloLikelihood", "guided_answer_logits", "mask_counts", "random_masks",
           "request_seed", "rolling_windows", "weighted_nll"]

"""Shared helpers of the oracle tests: batches, a threshold sampler, closed forms, an exact
enumerator of confidence-ordered top-k decoding (ParallelBench, arXiv 2510.04767)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import torch

import dllm
from dllm import tasks as T
from dllm.models.oracle import OracleLM, oracle_prompts
from dllm.samplers._ops import argmax_excluding, gather_prob
from dllm.samplers.base import Sampler
from dllm.state import StepOutput


def content_length(ex: T.Example) -> int:
    """Answer words without the EOS (the answer region minus its final EOS)."""
    return T.answer_length(ex.task, ex.size) - 1


def repeated(task: str, size: int, rows: int, prompts: int = 8) -> list[T.Example]:
    """``rows`` examples cycling over ``prompts`` test-split prompts (few prompts keep the oracle's
    per-forward cache hot; the closed forms do not depend on the items)."""
    base = T.test_split(task, size, prompts)
    return [base[i % prompts] for i in range(rows)]


def decode(model: OracleLM, examples, *, k: int, sampler="low_confidence", temperature=0.0,
           seed=0, gen_length=None, **kw):
    """Decode the content region (gen_length = content length, no EOS position) with k tokens per
    step (steps = ceil(n / k), LLaDA's schedule) and return (valid flags, GenerationOutput)."""
    n = gen_length or content_length(examples[0])
    out = dllm.generate(model, oracle_prompts(examples), sampler=sampler, gen_length=n,
                        steps=None if k is None else -(-n // k), temperature=temperature,
                        seed=seed, **kw)
    vocab = T.vocabulary()
    valid = [T.is_valid_answer(ex, [vocab[t] for t in row]) for ex, row in zip(examples, out.generated.tolist())]
    return valid, out


def binomial_ok(hits: int, rows: int, p: float, sigmas: float = 4.0) -> bool:
    """|hits/rows - p| within ``sigmas`` binomial standard deviations (plus one count)."""
    sd = math.sqrt(max(p * (1 - p), 1e-12) / rows)
    return abs(hits / rows - p) <= sigmas * sd + 1.0 / rows


# ---- closed forms (ParallelBench, arXiv 2510.04767) -------------------------------------------------
def shuffle_topk(n: int, k: int) -> float:
    """Acc(k) = prod_i P(m_i, k_i) / m_i^k_i over groups of k (the last takes the remainder)."""
    acc, m = 1.0, n
    while m > 0:
        g = min(k, m)
        acc *= math.perm(m, g) / m**g
        m -= g
    return acc


def replace_random_one_step(n: int) -> float:
    """Temperature-1 validity of all n positions sampled at once: ((n-1)/n)^(n-1)."""
    return ((n - 1) / n) ** (n - 1)


def replace_random_random_order(n: int, k: int) -> float:
    """Temperature 1, random positions (note 3): S(m) = P0 S(m - k') + P1, S(0) = 0."""
    @lru_cache(maxsize=None)
    def s(m: int) -> float:
        if m == 0:
            return 0.0
        kk = min(k, m)
        p0 = (1 - 1 / m) ** kk
        p1 = kk * (1 / m) * (1 - 1 / m) ** (kk - 1)
        return p0 * s(m - kk) + p1
    return s(n)


def llada_schedule(n: int, steps: int) -> list[int]:
    return [n // steps + (i < n % steps) for i in range(steps)]


def exact_confidence_topk(ex: T.Example, k: int) -> float:
    """Exact validity of low_confidence top-k decoding at temperature 1 over the content region:
    each step samples every masked position from its marginal, commits the k' most confident
    (confidence = the sampled word's probability; ties -> lower position first, as the engine's
    stable sort), and conditions the next step on them. Enumerates every sample."""
    n = content_length(ex)
    schedule = llada_schedule(n, -(-n // k))

    @lru_cache(maxsize=None)
    def rec(committed: frozenset, step: int) -> float:
        done = dict(committed)
        if step == len(schedule):
            return float(T.is_valid_answer(ex, [done[i] for i in range(n)]))
        margs = T.marginals(ex, done)
        if margs is None:
            return 0.0
        masked = [i for i in range(n) if i not in done]
        total = 0.0
        for draw in itertools.product(*(sorted(margs[i].items()) for i in masked)):
            p = math.prod(q for _, q in draw)
            order = sorted(range(len(masked)), key=lambda a: -draw[a][1])  # stable: lower index first
            new = dict(done)
            for a in order[:schedule[step]]:
                new[masked[a]] = draw[a][0]
            total += p * rec(frozenset(new.items()), step + 1)
        return total

    return rec(frozenset(), 0)


# ---- a test-local adaptive threshold sampler ----------------------------------------------------------
@dataclass(frozen=True)
class ThresholdConfig:
    gamma: float = 0.9
    strict: bool = False  # False: accept c >= gamma (Fast-dLLM); True: accept c > gamma
    tol: float = 1e-6  # comparisons in exact arithmetic: float32 round-off of c is below tol


class Threshold(Sampler):
    """Greedy proposals; commit every active position whose confidence passes gamma (the engine
    adds the most confident one when none does)."""

    Config = ThresholdConfig
    fixed_steps = False

    def step(self, inp, state):
        probs = torch.softmax(inp.logits.float(), dim=-1)  # [B, Q, V]
        x0 = argmax_excluding(inp.logits, inp.mask_id)  # [B, Q]
        conf = gather_prob(probs, x0)  # [B, Q]
        g, tol = self.config.gamma, self.config.tol
        passed = conf > g + tol if self.config.strict else conf >= g - tol
        return StepOutput(commit=passed & inp.active, tokens=x0, score=conf.masked_fill(~inp.active, -1.0))


def exact_one_step(ex: T.Example) -> float:
    """Temperature-1 validity of sampling every position at once from its marginal:
    sum over valid answers a of prod_i p_i(a_i) (answers are distinct sequences)."""
    margs = T.marginals(ex)
    return float(sum(math.prod(margs[i][w] for i, w in enumerate(a)) for a in T.valid_answers(ex)))

"""Exact-match evaluation on the stress tasks: decode the test examples, then score them.

``decode_and_score`` is the one decode-and-score loop, used by training's evaluation
(``evaluate``), ``dllm eval-tasks``, ``dllm compare`` and ``dllm stress``: the examples are grouped by
answer length ``L_ans`` (and by task when asked), every group is decoded with one ``DecodeSettings``
(``dllm.settings``) in batched ``generate`` calls as one block of ``L_ans`` (or blocks of the
setting's block length), and each generated answer is scored with ``T.score``; with ``record`` each
example's own outcome (forwards, content tokens, unmasking trace) is kept too.

``evaluate``: one token per step (or k) with the ``low_confidence`` sampler, greedy; examples from
all tasks that share an answer length are decoded in one call (prompts left-padded; exact in
float32), so an evaluation costs about ``sum over distinct L_ans of L_ans`` forwards.

``c0`` names the tasks whose answer is a function of the prompt, C(Y|X) = 0 (the total correlation
of the answer positions given the prompt is zero): ``c0_tasks()``, ``EvalResult.mean_c0``. They
are the quality bar: a model that has learned such a task solves it at one token per step.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Optional, Sequence

import torch

from dllm import tasks as T
from dllm.inputs import model_device
from dllm.options import check_int
from dllm.settings import DecodeSettings


@lru_cache(maxsize=None)
def c0_tasks(per_size: int = 2, suite: str = T.PB_MINI) -> tuple[str, ...]:
    """The tasks of ``suite`` (default: PB-mini) with C(Y|X) = 0: the first ``per_size`` test
    instances of every default size are checked with ``T.total_correlation``."""
    out = []
    for entry in T.tasks:
        if entry.obj.suite != suite:
            continue
        exs = T.test_split(entry.name, None, n=per_size)
        tcs = [T.total_correlation(ex) for ex in exs]
        if all(tc is not None and tc <= 1e-9 for tc in tcs):
            out.append(entry.name)
    return tuple(out)


def c0_of(task_names: Iterable[str]) -> tuple[str, ...]:
    """The C(Y|X) = 0 tasks among ``task_names``, whatever their suites (suite order, then registry
    order)."""
    names = set(task_names)
    suites = [s for s in T.SUITES if any(T.get_task(n).suite == s for n in names)]
    return tuple(t for s in suites for t in c0_tasks(suite=s) if t in names)


@dataclass(frozen=True)
class Outcome:
    """One example's decode (``decode_and_score(record=True)``)."""

    correct: bool
    forwards: float  # the steps that changed its row x forwards per step of its call: its forwards alone
    content: int  # generated tokens before the first EOS (all of them without one)
    trace: list[int]  # per generated position, the step that committed it
    row: list[int] = field(default_factory=list)  # the generated answer region's word ids


class RowSteps:
    """A ``generate`` callback counting, per row, the sampler steps that changed its canvas row."""

    def __init__(self) -> None:
        self.prev: Optional[torch.Tensor] = None  # [B, G] the generated region after the last step
        self.steps: Optional[torch.Tensor] = None  # [B] long

    def __call__(self, state) -> None:
        gen = state.generated  # [B, G]
        if self.prev is None:
            self.prev = torch.full_like(gen, state.mask_id)
            self.steps = torch.zeros(gen.shape[0], dtype=torch.long, device=gen.device)
        self.steps += (gen != self.prev).any(dim=1)
        self.prev = gen.clone()


@dataclass
class Tally:
    """What ``decode_and_score`` counted."""

    correct: dict[str, int]  # task -> exactly matched examples
    counts: dict[str, int]  # task -> decoded examples
    forwards: int = 0  # NFE summed over the generate calls
    row_forwards: int = 0  # NFE x rows summed: the forwards each example took part in
    forwarded_tokens: int = 0
    generated_tokens: int = 0
    content_tokens: int = 0  # generated tokens up to EOS
    seconds: float = 0.0
    solved: dict[int, bool] = field(default_factory=dict)  # index in the examples given -> exact match
    outcomes: dict[int, "Outcome"] = field(default_factory=dict)  # index -> outcome (``record=True`` only)

    @property
    def examples(self) -> int:
        return sum(self.counts.values())

    @property
    def accuracy(self) -> dict[str, float]:
        """task -> exact-match accuracy."""
        return {t: self.correct[t] / self.counts[t] for t in sorted(self.counts)}


BUCKET_MIN_LEN = 128  # prompts of at least this many tokens are batched with prompts of similar length
BUCKET_RATIO = 1.5  # ... at most this many times longer than the shortest of their batch


def length_batches(group: Sequence[T.Example], max_batch: int, by_length: bool = True) -> list[list[T.Example]]:
    """Batches of at most ``max_batch`` examples. A group whose prompts are all shorter than
    ``BUCKET_MIN_LEN`` tokens (or any group with ``by_length=False``) is cut in its own order (one
    batch when it fits); otherwise it is sorted by prompt length and a batch never holds a prompt
    more than ``BUCKET_RATIO`` times the length of its shortest: left padding to the longest row
    would otherwise make every short prompt pay for the long ones (a long-prompt suite batch of
    256- to 2,040-word prompts decodes 1.8x slower with packed attention than the same prompts one
    at a time: benchmarks/results/packed-suite.txt)."""
    lengths = [len(T.prompt_ids(ex)) for ex in group]
    if not by_length or max(lengths, default=0) < BUCKET_MIN_LEN:
        return [list(group[i:i + max_batch]) for i in range(0, len(group), max_batch)]
    batches: list[list[T.Example]] = []
    shortest = 0
    for length, ex in sorted(zip(lengths, group), key=lambda p: p[0]):
        if not batches or len(batches[-1]) == max_batch or length > BUCKET_RATIO * shortest:
            batches.append([])
            shortest = length
        batches[-1].append(ex)
    return batches


@torch.no_grad()
def decode_and_score(
    model,
    examples: Sequence[T.Example],
    sampler: "str | DecodeSettings" = "low_confidence",
    *,
    tokens_per_step: Optional[int] = None,
    block_length: Optional[int] = None,
    by_task: bool = False,
    max_batch: int = 256,
    by_length: bool = True,
    autocast_bf16: bool = False,
    progress: Any = None,
    seed: Optional[int] = None,
    record: bool = False,
    cuda_graphs: Any = False,
    **options: Any,
) -> Tally:
    """Decode every example as ``L_ans`` generated positions and score it with ``T.score``.

    sampler: ``DecodeSettings``, or a sampler spec (``DecodeSettings.parse``'s text form) completed by
        ``tokens_per_step`` (k, fixed-step samplers only: ``ceil(block / k)`` steps per block; None:
        the sampler's own steps, one token per step for a fixed-step sampler), ``block_length``
        (blocks of at most this length; None: one block of ``L_ans``) and ``options`` (the rest of
        ``generate``'s keyword arguments: sampler options, ``cache=...``).
    by_task: one batch per (task, ``L_ans``) instead of per ``L_ans``: an adaptive sampler's forwards
        are shared by the rows of a batch, so mixing easy and hard tasks would charge the easy ones
        for the hard ones.
    by_length: long prompts are batched with prompts of similar length (``length_batches``).
    progress: anything with ``update(n)`` (a tqdm bar), advanced by the rows of each batch.
    seed: ``generate``'s seed for every call (None: its default).
    cuda_graphs: ``generate``'s ``cuda_graphs`` for every call (False: eager; True: the cached forwards
        replayed as CUDA graphs; ``"static"``: the same static step run eagerly, any device).
    record: also keep every example's ``Outcome`` (``Tally.outcomes``): the forwards it takes
        decoded alone (the steps that changed its row, ``RowSteps``, times the forwards per step of
        its call), its content tokens and its unmasking trace.
    """
    setting = settings_of(sampler, tokens_per_step, block_length, options)
    setting.check().prepare(model_device(model))  # a sampler's own model loads before the clock
    check_int("max_batch", max_batch, 1, hint=" (examples per batch)")
    from dllm.cache.block_causal import block_size_of
    from dllm.engine import generate

    # a block-causal model (SDAR) decodes on its own grid: a batch shares its blocks, so its prompts
    # must agree in length mod the block; the blocks, and so the steps for k, are ``plan_for``'s
    grid = block_size_of(model)
    groups: dict[tuple[str, int, int], list[T.Example]] = defaultdict(list)
    index: dict[int, list[int]] = defaultdict(list)  # id(example) -> its positions in ``examples``
    for i, ex in enumerate(examples):
        offset = len(T.prompt_ids(ex)) % grid if grid else 0
        groups[(ex.task if by_task else "", T.answer_length(ex.task, ex.size), offset)].append(ex)
        index[id(ex)].append(i)
    tally = Tally(defaultdict(int), defaultdict(int))
    extra: dict[str, Any] = {} if seed is None else {"seed": seed}
    if cuda_graphs is not False:
        extra["cuda_graphs"] = cuda_graphs
    eos = T.word_id(T.EOS)
    device_type = model_device(model).type
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    try:
        for (_, la, offset), group in sorted(groups.items()):
            bl = setting.block_length if grid else min(setting.block_length or la, la)  # the grid's block: as given
            # k -> steps on this group's block plan (the grid's offset is the group's)
            kwargs = setting.replace(block_length=bl).with_steps(model, [T.prompt_ids(group[0])], la)
            kwargs = kwargs.generate_kwargs()
            for chunk in length_batches(group, max_batch, by_length):
                prompts = [T.prompt_ids(ex) for ex in chunk]
                counter = RowSteps() if record else None
                if record:
                    extra.update(return_trace=True, callback=counter)
                with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast_bf16):
                    out = generate(model, prompts, gen_length=la, **{**kwargs, **extra})
                tally.forwards += out.nfe
                tally.row_forwards += out.nfe * len(chunk)
                tally.forwarded_tokens += out.forwarded_tokens
                tally.generated_tokens += out.generated_tokens
                tally.content_tokens += out.content_tokens
                per_step = out.nfe / max(out.steps, 1)  # forwards per sampler step (1 unless verification forwards)
                for r, (ex, row) in enumerate(zip(chunk, out.generated.tolist())):
                    ok = bool(T.score(ex, T.words_of(row)))
                    tally.correct[ex.task] += ok
                    tally.counts[ex.task] += 1
                    i = index[id(ex)].pop(0)
                    tally.solved[i] = ok
                    if record:
                        tally.outcomes[i] = Outcome(ok, int(counter.steps[r]) * per_step,
                                                    row.index(eos) if eos in row else la, out.trace[r].tolist(), row)
                if progress is not None:
                    progress.update(len(chunk))
    finally:
        model.train(was_training)
    tally.seconds = time.perf_counter() - t0
    return tally


def settings_of(sampler: "str | DecodeSettings", tokens_per_step: Optional[int], block_length: Optional[int],
                options: dict[str, Any]) -> DecodeSettings:
    """``decode_and_score``'s settings: ``DecodeSettings`` given alone, or a spec in the text form with
    k, a block length and ``generate``'s other keywords (``DecodeSettings.parse``)."""
    if isinstance(sampler, DecodeSettings):
        if tokens_per_step is not None or block_length is not None or options:
            raise ValueError("give DecodeSettings alone, or a sampler spec with tokens_per_step / block_length / "
                             f"options; got settings and {({'k': tokens_per_step, 'block_length': block_length, **options})}")
        return sampler
    return DecodeSettings.parse(sampler, k=tokens_per_step, block_length=block_length, options=options)


@dataclass
class EvalResult:
    accuracy: dict[str, float]  # task -> exact-match accuracy on its slice
    counts: dict[str, int]  # task -> evaluated examples
    c0: tuple[str, ...]  # the C(Y|X) = 0 tasks among those evaluated
    forwards: int = 0
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        """Mean accuracy over the evaluated tasks (each task weighs the same)."""
        return math.fsum(self.accuracy.values()) / max(len(self.accuracy), 1)

    @property
    def mean_c0(self) -> float:
        """Mean accuracy over the C(Y|X) = 0 tasks (the best-checkpoint metric); NaN if none."""
        vals = [self.accuracy[t] for t in self.c0]
        return math.fsum(vals) / len(vals) if vals else math.nan

    def to_log(self) -> dict[str, object]:
        return {
            "eval_mean_c0": round(self.mean_c0, 4),
            "eval_mean": round(self.mean, 4),
            "eval_examples": sum(self.counts.values()),
            "eval_forwards": self.forwards,
            "eval_seconds": round(self.seconds, 2),
            "eval": {t: round(a, 4) for t, a in sorted(self.accuracy.items())},
        }


def load_model(name: str, dtype: Optional[str] = None, device: Optional[str] = None):
    """``dllm.models.load`` for an evaluation: the weightless ``oracle`` takes no dtype."""
    from dllm.models import load

    return load(name, dtype=None if name == "oracle" else dtype, device=device)


def check_test_range(per_size: int, skip: int = 0) -> None:
    """ValueError unless test instances ``skip .. skip + per_size - 1`` exist in every size's split."""
    if skip < 0 or per_size < 1 or skip + per_size > T.TEST_SPLIT_SIZE:
        raise ValueError(f"test instances {skip}..{skip + per_size - 1} (skip={skip}, per_size={per_size}) are not "
                         f"in the test split: it holds instances 0..{T.TEST_SPLIT_SIZE - 1} of each size")


def eval_examples(tasks: Optional[Sequence[str]] = None, per_size: int = 4, skip: int = 0) -> list[T.Example]:
    """Test instances ``skip .. skip + per_size - 1`` of every default size of each task (the first
    ``per_size`` by default; ``skip`` > 0 gives a sample disjoint from an earlier evaluation's)."""
    check_test_range(per_size, skip)
    names = [T.get_task(n).name for n in tasks] if tasks else list(T.suite_task_names())
    return [ex for n in names for s in T.get_task(n).default_sizes
            for ex in T.test_split(n, s, n=skip + per_size)[skip:]]


def evaluate(
    model,
    examples: Sequence[T.Example],
    *,
    max_batch: int = 256,
    autocast_bf16: bool = False,
    tokens_per_step: Optional[int] = 1,
    sampler: str = "low_confidence",
) -> EvalResult:
    """Decode every example (one block of the answer length) and score it with ``T.score``.

    ``tokens_per_step`` = k: ``steps = ceil(L_ans / k)``, so the fixed-step sampler commits k per
    step; None for an adaptive sampler (see ``decode_and_score``).
    """
    tally = decode_and_score(model, examples, sampler, tokens_per_step=tokens_per_step, max_batch=max_batch,
                             autocast_bf16=autocast_bf16)
    c0 = c0_of(tally.counts)
    return EvalResult(tally.accuracy, dict(tally.counts), c0, tally.forwards, tally.seconds)


__all__ = ["EvalResult", "Outcome", "RowSteps", "Tally", "c0_of", "c0_tasks", "check_test_range", "decode_and_score",
           "eval_examples", "evaluate", "load_model", "settings_of"]

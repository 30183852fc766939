"""Training batches from a weighted mixture of the PB-mini stress tasks (``dllm.tasks``).

Layout of a batch row (right padding)::

    [BOS] task args [SEP] answer EOS ... EOS [PAD ... PAD]

``key_padding_mask`` is False on the pads (real tokens never attend to them) and ``positions =
cumsum(key_padding_mask) - 1`` (clamped at 0), the rule ``dllm.generate`` uses for its left-padded
prompts: in both cases the first real token has position 0 and the row computes exactly what it
computes alone, so training and decoding see the same positions. Each row's answer keeps its own
fixed length ``L_ans`` (its EOS padding included), as at decode time with ``gen_length = L_ans``.
Right padding (not left-padding prompts to a common answer column) lets length bucketing cut the
batch width to the longest *sequence* instead of longest prompt + longest answer.

Sampling: task ~ the mixture weights, size ~ uniform over the task's sizes, then
``T.generate(task, rng, size)`` (multi-answer targets uniform over the valid answers); an example
whose prompt is in the canonical test split (``T.is_test_prompt``; for a training-only variant that
carries a suite task's word, ``count_cM`` / ``lookup_kW``, that task's split too: :func:`is_held_out`)
is redrawn with the same task and size. Length bucketing: the examples of ``length_bucket``
consecutive steps are drawn together, sorted by sequence length and dealt out as that many batches
in a random order (each example's distribution is unchanged; measured mean width 37.4 -> 25.4
tokens with 4, real tokens ~21.7).
Batch ``step`` is a pure function of ``(seed, step)``, so resuming needs no data-loader state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Iterator, Optional, Sequence, Union

import torch

from dllm import tasks as T
from dllm.models.text.task_tokenizer import task_tokenizer

MAX_REDRAWS = 1000  # test-prompt rejections in a row before giving up on a (task, size)


@dataclass(frozen=True)
class MixtureConfig:
    """Which tasks to train on, how often, at which sizes.

    tasks: registered task names (aliases allowed); empty = every registered task.
    weights: relative sampling weights aligned with ``tasks``; empty = uniform.
    sizes: per-task size tuples aligned with ``tasks``; empty = each task's full size range
        (``min_size .. max_size``, wider than the default test sizes).
    length_bucket: consecutive batches drawn together and sorted by length (1 = no bucketing).
    """

    tasks: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()
    sizes: tuple[tuple[int, ...], ...] = ()
    length_bucket: int = 4

    def __post_init__(self) -> None:
        names = self.task_names()
        if self.weights and len(self.weights) != len(names):
            raise ValueError(f"MixtureConfig.weights has {len(self.weights)} entries for {len(names)} tasks")
        if any(w < 0 for w in self.weights) or (self.weights and sum(self.weights) <= 0):
            raise ValueError(f"MixtureConfig.weights must be >= 0 with a positive sum, got {self.weights}")
        if self.sizes and len(self.sizes) != len(names):
            raise ValueError(f"MixtureConfig.sizes has {len(self.sizes)} entries for {len(names)} tasks")
        for name, sizes in zip(names, self.task_sizes()):
            if not sizes:
                raise ValueError(f"MixtureConfig.sizes: task {name!r} has no sizes")
            for s in sizes:
                T.get_task(name).check_size(s)
        if not isinstance(self.length_bucket, int) or self.length_bucket < 1:
            raise ValueError(f"MixtureConfig.length_bucket must be an int >= 1, got {self.length_bucket!r}")

    def task_names(self) -> tuple[str, ...]:
        """Canonical task names (registry order when ``tasks`` is empty)."""
        if not self.tasks:
            return T.suite_task_names()
        return tuple(T.get_task(n).name for n in self.tasks)

    def task_weights(self) -> tuple[float, ...]:
        """Normalised weights aligned with :meth:`task_names`."""
        names = self.task_names()
        raw = self.weights or (1.0,) * len(names)
        total = float(sum(raw))
        return tuple(w / total for w in raw)

    def task_sizes(self) -> tuple[tuple[int, ...], ...]:
        names = self.task_names()
        if self.sizes:
            return tuple(tuple(s) for s in self.sizes)
        return tuple(tuple(T.get_task(n).sizes) for n in names)

    def max_sequence_length(self) -> int:
        """The widest possible batch: the longest sequence of the mixture."""
        return max(T.sequence_length(n, s) for n, sizes in zip(self.task_names(), self.task_sizes())
                   for s in sizes)


@dataclass
class Batch:
    """One training batch (see the module docstring for the layout)."""

    input_ids: torch.Tensor  # [B, L] long, clean tokens, pads = [PAD]
    answer_mask: torch.Tensor  # [B, L] bool, True on answer tokens (EOS padding included)
    key_padding_mask: torch.Tensor  # [B, L] bool, True on real tokens
    tasks: tuple[str, ...]  # task of each row

    @property
    def positions(self) -> torch.Tensor:
        """[B, L] long RoPE positions: cumsum(valid) - 1, clamped at 0 (as ``dllm.generate``)."""
        return (self.key_padding_mask.long().cumsum(dim=1) - 1).clamp_min(0)

    @property
    def answer_len(self) -> torch.Tensor:
        """[B] answer tokens per row."""
        return self.answer_mask.sum(dim=1)

    @property
    def n_tokens(self) -> int:
        """Real (non-pad) tokens in the batch (one host sync)."""
        return int(self.key_padding_mask.sum())

    def __iter__(self) -> Iterator[torch.Tensor]:  # (input_ids, answer_mask, key_padding_mask)
        return iter((self.input_ids, self.answer_mask, self.key_padding_mask))

    def to(self, device: Union[str, torch.device]) -> "Batch":
        return Batch(self.input_ids.to(device), self.answer_mask.to(device),
                     self.key_padding_mask.to(device), self.tasks)


def collate(examples: Sequence[T.Example], vocab: dict[str, int]) -> Batch:
    """Examples -> a right-padded Batch."""
    pad_id = vocab[T.PAD]
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    answers = [[vocab[w] for w in T.target_words(ex)] for ex in examples]
    width = max(len(p) + len(a) for p, a in zip(prompts, answers))
    b = len(examples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)  # [B, L]
    real = torch.zeros((b, width), dtype=torch.bool)  # [B, L]
    answer = torch.zeros((b, width), dtype=torch.bool)  # [B, L]
    for j, (p, a) in enumerate(zip(prompts, answers)):
        lp, n = len(p), len(p) + len(a)
        ids[j, :n] = torch.tensor(p + a)
        real[j, :n] = True
        answer[j, lp:n] = True
    return Batch(ids, answer, real, tuple(ex.task for ex in examples))


def is_held_out(ex: T.Example) -> bool:
    """Whether training must redraw ``ex``: its prompt is in its task's test split (``T.is_test_prompt``),
    or ``ex`` is of a training-only variant whose prompts carry a suite task's word (``Task.word``:
    ``count_cM`` -> ``count_long``, ``lookup_kW`` -> ``lookup_long``; ``dllm/train/recipes/narrow_tasks.py``)
    and its prompt is among the first ``T.TEST_SPLIT_SIZE`` instances of that task's test split at its
    size (the prompts the evaluations of that task draw, ``T.test_split``)."""
    if T.is_test_prompt(ex):
        return True
    task = T.get_task(ex.task)
    word = task.task_word
    return word != task.name and hash(ex.prompt) in _split_hashes(word, ex.size) and ex.prompt in {
        held.prompt for held in T.test_split(word, ex.size, T.TEST_SPLIT_SIZE)}


@lru_cache(maxsize=None)
def _split_hashes(task: str, size: int) -> frozenset[int]:
    """Hashes of the prompts of ``task``'s test split at ``size`` (empty outside its size range): a few
    bytes per prompt, where the long tasks' prompts hold up to 2,040 words and every size may be drawn."""
    t = T.get_task(task)
    if not t.min_size <= size <= t.max_size:
        return frozenset()
    return frozenset(hash(ex.prompt) for ex in T.test_split(t.name, size, T.TEST_SPLIT_SIZE))


def example_length(ex: T.Example) -> int:
    """Tokens of the full training sequence of ``ex`` (prompt + EOS-padded answer)."""
    return T.sequence_length(ex.task, ex.size)


class TaskMixture:
    """Deterministic example and batch source over a :class:`MixtureConfig`.

    >>> mix = TaskMixture(MixtureConfig(), seed=0)
    >>> batch = mix.batch(step=0, batch_size=64)        # same tensors on every call / machine
    >>> for step, batch in mix.batches(64, start=100): ...
    """

    def __init__(self, config: MixtureConfig = MixtureConfig(), seed: int = 0,
                 tokenizer: Optional[Any] = None) -> None:
        self.config = config
        self.seed = int(seed)
        self.names = config.task_names()
        self.weights = config.task_weights()
        self.sizes = config.task_sizes()
        self.tokenizer = tokenizer if tokenizer is not None else task_tokenizer()
        self.vocab: dict[str, int] = dict(self.tokenizer.get_vocab())
        self.rejected = 0  # test-split prompts redrawn so far (diagnostics)
        self._group: tuple[tuple[int, int], list[list[T.Example]]] | None = None  # last bucket group

    def rng(self, group: int) -> random.Random:
        # str seeds are hashed with SHA-512 by random.Random: stable across runs and machines
        return random.Random(f"dllm.train.data|{self.seed}|{group}")

    def sample(self, rng: random.Random) -> T.Example:
        """One training example: task by weight, size uniform, test-split prompts redrawn."""
        k = rng.choices(range(len(self.names)), weights=self.weights)[0]
        name, size = self.names[k], rng.choice(self.sizes[k])
        for _ in range(MAX_REDRAWS):
            ex = T.generate(name, rng, size)
            if not is_held_out(ex):
                return ex
            self.rejected += 1
        raise RuntimeError(f"task {name!r} size {size}: {MAX_REDRAWS} draws in a row were test-split "
                           "prompts; drop this size from the mixture")

    def examples(self, step: int, batch_size: int) -> list[T.Example]:
        """The examples of training step ``step`` (a pure function of seed, step, batch size)."""
        k = self.config.length_bucket
        group = step // k
        if self._group is None or self._group[0] != (group, batch_size):
            rng = self.rng(group)
            pool = [self.sample(rng) for _ in range(k * batch_size)]
            pool.sort(key=example_length)  # stable: equal lengths keep their random order
            chunks = [pool[i * batch_size:(i + 1) * batch_size] for i in range(k)]
            rng.shuffle(chunks)  # which length bucket comes first is random too
            self._group = ((group, batch_size), chunks)
        return list(self._group[1][step % k])

    def batch(self, step: int, batch_size: int) -> Batch:
        """The batch of training step ``step``."""
        return collate(self.examples(step, batch_size), self.vocab)

    def batches(self, batch_size: int, start: int = 0) -> Iterator[tuple[int, Batch]]:
        """(step, batch) for step = start, start + 1, ... (endless)."""
        step = start
        while True:
            yield step, self.batch(step, batch_size)
            step += 1


def task_list(text: str) -> tuple[str, ...]:
    """``--tasks``'s comma-separated names, canonical (aliases and the curriculum variants ``lookup_kW`` /
    ``count_cM`` resolved); an unknown name is a ValueError listing the valid ones."""
    from dllm.train.recipes.narrow_tasks import curriculum_task

    names = tuple(T.get_task(curriculum_task(t.strip())).name for t in text.split(",") if t.strip())
    if not names:
        raise ValueError(f"--tasks {text!r}: no task named (comma-separated task names)")
    return names


def restricted(mix: MixtureConfig, names: Sequence[str], recipe: str, start: Optional[int] = None) -> MixtureConfig:
    """``mix`` (recipe ``recipe``'s own, or its phase from step ``start``) restricted to the tasks ``names``,
    each kept task with its weight and sizes; a mixture that would keep no task of positive weight is a
    ValueError naming the phase and its tasks."""
    have = mix.task_names()
    weights, sizes = mix.task_weights(), mix.task_sizes()
    keep = [i for i, n in enumerate(have) if n in names and weights[i] > 0]
    if not keep:
        where = f"recipe {recipe!r}" + ("" if start is None else f", its phase from step {start},")
        hint = "" if start is None else f", or --steps {start} to end before this phase"
        raise ValueError(f"--tasks {','.join(names)}: {where} trains none of them (its tasks: {', '.join(have)}); "
                         f"name at least one of its tasks{hint}")
    return replace(mix, tasks=tuple(have[i] for i in keep), weights=tuple(mix.weights[i] for i in keep)
                   if mix.weights else (), sizes=tuple(sizes[i] for i in keep) if mix.sizes else ())


__all__ = ["Batch", "MixtureConfig", "TaskMixture", "collate", "example_length", "is_held_out", "restricted",
           "task_list"]

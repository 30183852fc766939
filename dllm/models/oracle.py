"""Oracle models: a weightless ``DiffusionLM`` whose logits are the exact posterior marginals of the
PB-mini stress tasks (``dllm.tasks``), given the words already committed.

For every row of a batch the oracle reads ``[PAD]* [BOS] <task> <args...> [SEP] <answer region>``,
rebuilds the problem with ``tasks.parse_prompt`` and returns, at every masked position of the answer
region, ``log P(word at i | prompt, committed words)`` under the uniform distribution over the valid
answers that agree with the committed (non-mask) words of the region.
It is task-agnostic: one model serves every task, and a batch may mix tasks and prompt lengths.

Logits, [B, T, V] float32 over the PB-mini vocabulary (``V = len(tasks.vocabulary())``):

- masked answer positions: ``log p`` on the support, ``NEG_LOGIT`` (-1e4) elsewhere;
- non-mask positions (prompt, left pads, committed answer words): a one-hot (0 on the position's own
  token, ``NEG_LOGIT`` elsewhere);
- answer positions past ``L_ans = answer_length(task, size)`` (a ``gen_length`` longer than the
  answer region): ``[EOS]``, since answers are EOS-padded. A shorter ``gen_length`` simply leaves
  the last positions of the region out (the committed ones still condition the rest);
- ``noise_std > 0`` adds i.i.d. ``N(0, noise_std^2)`` to every logit from the model's own seeded
  generator: ParallelBench's "unbiased model" (arXiv 2510.04767), which breaks ties independently
  per position (its closed forms for top-k decoding need it, or temperature-1 sampling).

When the committed words make the answer set empty, ``invalid="uniform"`` gives every masked answer
position the uniform distribution over the non-special words (logit 0 on them, ``NEG_LOGIT`` on the
specials, EOS included), so decoding continues and the row scores as failed; ``invalid="raise"``
raises instead (useful for asserting that a sampler never leaves the answer set).
``last_invalid`` holds the rows of the latest forward that had no consistent answer.

Cost: answer tables (``Task.answer_table``) are enumerated once per prompt and kept here in a
byte-bounded LRU (``TABLE_CACHE_BYTES``), because ``tasks.marginals`` keeps only 32 tables and a
batch with more distinct prompts would re-enumerate them at every step (8! rows: ~40 ms each).
Tasks that compute marginals by counting (``chain``) go through ``tasks.marginals``. Inside one
forward, rows with the same prompt and committed words are computed once; the marginals with
nothing committed are memoised per prompt. A batch-16 forward takes ~1-10 ms.

Not available: attention maps and hidden states (there are no layers), classifier-free guidance
(its unconditional branch masks the prompt, which the oracle needs), KV caches.

>>> import dllm
>>> from dllm import tasks
>>> from dllm.models.oracle import OracleLM, oracle_prompts, score_generation
>>> exs = tasks.test_split("replace_random", 4, 8)
>>> out = dllm.generate(OracleLM(), oracle_prompts(exs), gen_length=5, steps=5)
>>> score_generation(exs, out)  # one token per step: all True
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from dllm import tasks as T
from dllm.tasks.base import Task
from dllm.models.base import DiffusionLM
from dllm.models.inputs import SpecialIds
from dllm.models.core.config import TransformerConfig

NEG_LOGIT = -1e4  # "impossible": finite, so sums and guidance stay finite; exp() underflows to 0
INVALID_MODES = ("uniform", "raise")
TABLE_CACHE_BYTES = 256 << 20  # answer tables kept across forwards (8! rows x 17 words = 1.4 MB)

_LAZY = object()  # tokenizer not built yet (building it imports transformers: seconds)


@dataclass(eq=False)
class _Problem:
    """A parsed prompt: the example, its answer length and (table tasks) its answer-id table."""

    example: T.Example
    length: int  # L_ans
    table: Optional[np.ndarray]  # [N, L_ans] int16 ids of every valid answer; None: ask the task
    prior: Optional[np.ndarray] = None  # [L_ans, V] log-marginals with nothing committed (memo)

    @property
    def nbytes(self) -> int:
        return 0 if self.table is None else int(self.table.nbytes)


class OracleLM(DiffusionLM):
    """Exact-posterior denoiser for the PB-mini stress tasks (see the module docstring).

    Args:
        noise_std: std of the i.i.d. Gaussian noise added to every logit (0: exact marginals).
        seed: seed of the noise generator (None: nondeterministic). ``reseed`` restarts it.
        invalid: what a row whose committed words fit no valid answer gets: ``"uniform"`` (uniform
            over the non-special words at its masked answer positions) or ``"raise"``.
        max_positions: longest canvas ``generate`` accepts (the oracle itself has no limit).
    """

    family = "oracle"

    def __init__(self, noise_std: float = 0.0, seed: Optional[int] = None, invalid: str = "uniform",
                 *, max_positions: int = 4096) -> None:
        if not isinstance(noise_std, (int, float)) or isinstance(noise_std, bool) or not noise_std >= 0:
            raise ValueError(f"noise_std must be a number >= 0, got {noise_std!r}")
        if invalid not in INVALID_MODES:
            raise ValueError(f"invalid must be one of {', '.join(map(repr, INVALID_MODES))}, got {invalid!r}")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        vocab = T.vocabulary()
        # Only vocab_size and max_positions are read (by the engine); the sizes are placeholders.
        config = TransformerConfig(vocab_size=len(vocab), d_model=2, n_layers=1, n_heads=1, n_kv_heads=1,
                                   mlp_hidden=1, max_positions=max_positions)
        special = SpecialIds(mask_id=T.word_id(T.MASK), eos_id=T.word_id(T.EOS), pad_id=T.word_id(T.PAD),
                             bos_id=T.word_id(T.BOS))
        super().__init__(config, special, tokenizer=_LAZY)
        # No weights: this empty buffer carries the device (``.to(device)`` moves it).
        self.register_buffer("_anchor", torch.zeros(0), persistent=False)
        self.noise_std = float(noise_std)
        self.invalid = invalid
        self._vocab = vocab
        self._sep_id = T.word_id(T.SEP)
        self._special_ids = [T.word_id(w) for w in T.SPECIALS]
        self._problems: OrderedDict[tuple[int, ...], _Problem] = OrderedDict()  # LRU, prompt ids -> problem
        self._problem_bytes = 0
        self.last_invalid: Optional[torch.Tensor] = None  # [B] bool, rows of the latest forward
        self._noise_gen = torch.Generator()
        self.reseed(seed)

    # ---- attributes --------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The PB-mini word tokenizer, built on first use."""
        if self._tokenizer is _LAZY:
            self._tokenizer = _task_tokenizer()
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    @property
    def device(self) -> torch.device:
        return self._anchor.device

    def reseed(self, seed: Optional[int] = None) -> None:
        """Restart the noise generator (None: a nondeterministic seed)."""
        if seed is None:
            self._noise_gen.seed()
        else:
            self._noise_gen.manual_seed(seed)

    def extra_repr(self) -> str:
        return f"noise_std={self.noise_std}, invalid={self.invalid!r}"

    # ---- forward -----------------------------------------------------------------------------
    def _raw_forward(self, input_ids, positions, attn_mask, want_attn_layers, want_hidden_layers):
        if want_attn_layers or want_hidden_layers:
            raise ValueError(
                f"OracleLM has no layers, so no attention maps or hidden states (asked for attention "
                f"layers {list(want_attn_layers)}, hidden layers {list(want_hidden_layers)}); use a "
                "sampler that reads only logits"
            )
        rows = input_ids.tolist()  # one host copy; the oracle is Python over rows anyway
        logits, invalid = self._logits(rows, input_ids.shape[1])  # [B, T, V] float32 numpy
        out = torch.from_numpy(logits)
        if self.noise_std > 0:
            out += self.noise_std * torch.randn(out.shape, generator=self._noise_gen, dtype=out.dtype)
        self.last_invalid = torch.tensor(invalid, dtype=torch.bool, device=self.device)
        return out.to(self.device), {}, {}

    def _logits(self, rows: list[list[int]], width: int) -> tuple[np.ndarray, list[bool]]:
        v = self.config.vocab_size
        ids = np.asarray(rows, dtype=np.int64).reshape(len(rows), width)  # [B, T]
        if ids.size and (ids.min() < 0 or ids.max() >= v):
            raise ValueError(f"token ids must lie in [0, {v}) (the PB-mini vocabulary), got "
                             f"{int(ids.min())} .. {int(ids.max())}")
        logits = np.full((len(rows), width, v), NEG_LOGIT, dtype=np.float32)  # [B, T, V]
        # one-hot on every non-mask token (prompt, pads, committed words); answer regions follow
        np.put_along_axis(logits, ids[..., None], 0.0, axis=-1)
        groups: dict[tuple[int, ...], list[int]] = {}
        for j, row in enumerate(rows):
            groups.setdefault(tuple(row), []).append(j)
        invalid = [False] * len(rows)
        for key, members in groups.items():  # rows with equal prompt and commits: computed once
            start, block, bad = self._answer_logits(key, members[0])
            if block is not None:
                logits[members, start:start + block.shape[0]] = block
            for j in members:
                invalid[j] = bad
        return logits, invalid

    def _answer_logits(self, row: tuple[int, ...], j: int) -> tuple[int, Optional[np.ndarray], bool]:
        """(first answer column, logits [R, V] of the answer region or None, no consistent answer)."""
        mask_id, eos_id = self.mask_id, self.eos_id
        bos = _skip_pads(row, self.pad_id)
        if bos == len(row) or row[bos] != self.bos_id:
            if bos < len(row) and row[bos] == mask_id:
                if bos > 0:  # [PAD]* then the answer: no prompt words (CFG masks the pads too)
                    raise ValueError(f"row {j}: the prompt holds only {T.PAD} tokens (words the task "
                                     f"vocabulary does not know?); oracle rows look like {T.PAD}* "
                                     f"{T.BOS} <task> <args...> {T.SEP} <answer> (oracle_prompts() "
                                     "writes them)")
                raise ValueError(f"row {j}: the prompt is masked (classifier-free guidance's unconditional "
                                 "branch?); OracleLM needs the prompt, use cfg_scale=0")
            found = "nothing" if bos == len(row) else repr(self._vocab[row[bos]])
            raise ValueError(f"row {j}: expected {T.BOS} after the left padding, found {found}; oracle "
                             f"rows look like {T.PAD}* {T.BOS} <task> <args...> {T.SEP} <answer> "
                             "(oracle_prompts() writes them)")
        try:
            sep = row.index(self._sep_id, bos)
        except ValueError:
            raise ValueError(f"row {j}: the prompt has no {T.SEP}: "
                             f"{' '.join(self._vocab[t] for t in row[bos:])!r}") from None
        if mask_id in row[bos:sep]:
            raise ValueError(f"row {j}: the prompt contains {T.MASK}; only the answer region may be masked")
        problem = self._problem(row[bos:sep + 1], j)
        region = row[sep + 1:]
        length = problem.length
        inside, past = region[:length], region[length:]
        committed = [(i, t) for i, t in enumerate(inside) if t != mask_id]
        logp = None
        if all(t in (mask_id, eos_id) for t in past):  # answers are EOS-padded past L_ans
            logp = self._log_marginals(problem, committed)  # [L_ans, V] or None
        r = len(region)
        block = np.full((r, self.config.vocab_size), NEG_LOGIT, dtype=np.float32)  # [R, V]
        if logp is None:
            if self.invalid == "raise":
                words = " ".join(self._vocab[t] for t in region)
                raise ValueError(f"row {j}: no valid {problem.example.task!r} answer agrees with the "
                                 f"committed words {words!r} (OracleLM(invalid='raise'))")
            block[:] = 0.0
            block[:, self._special_ids] = NEG_LOGIT
        else:
            block[:min(r, length)] = logp[:r]
            block[length:, eos_id] = 0.0
        for i, t in enumerate(region):  # committed positions: one-hot on their own token
            if t != mask_id:
                block[i] = NEG_LOGIT
                block[i, t] = 0.0
        return sep + 1, block, logp is None

    def _log_marginals(self, problem: _Problem, committed: list[tuple[int, int]]) -> Optional[np.ndarray]:
        """log P(word | committed) per answer position, [L_ans, V] float32; None if no answer agrees."""
        if not committed:  # every row's first step: memoised per prompt
            if problem.prior is None:
                problem.prior = self._compute_log_marginals(problem, committed)
            return problem.prior
        return self._compute_log_marginals(problem, committed)

    def _compute_log_marginals(self, problem: _Problem, committed: list[tuple[int, int]]) -> Optional[np.ndarray]:
        v = self.config.vocab_size
        if problem.table is None:
            margs = T.marginals(problem.example, {i: self._vocab[t] for i, t in committed})
            if margs is None:
                return None
            out = np.full((problem.length, v), NEG_LOGIT, dtype=np.float32)
            for pos, dist in enumerate(margs):
                for word, p in dist.items():
                    out[pos, T.word_id(word)] = math.log(p)
            return out
        table = problem.table  # [N, L]
        keep = np.ones(table.shape[0], dtype=bool)
        for pos, tok in committed:
            keep &= table[:, pos] == tok
        rows = table[keep]  # [N', L]
        if rows.shape[0] == 0:
            return None
        length = table.shape[1]
        flat = rows.astype(np.int64) + np.arange(length, dtype=np.int64) * v  # [N', L] position-major ids
        counts = np.bincount(flat.ravel(), minlength=length * v).reshape(length, v)  # [L, V]
        with np.errstate(divide="ignore"):
            out = np.log(counts / rows.shape[0])  # same p = count / total as tasks.marginals
        out[counts == 0] = NEG_LOGIT
        return out.astype(np.float32)

    def _problem(self, prompt: tuple[int, ...], j: int) -> _Problem:
        """The parsed prompt (LRU-cached across forwards, bounded by the bytes of its tables)."""
        hit = self._problems.get(prompt)
        if hit is not None:
            self._problems.move_to_end(prompt)
            return hit
        words = [self._vocab[t] for t in prompt]
        try:
            ex = T.parse_prompt(words)
        except (ValueError, KeyError) as err:
            msg = err.args[0] if isinstance(err, KeyError) and err.args else err
            raise ValueError(f"row {j}: cannot read the prompt {' '.join(words)!r}: {msg}") from err
        task = T.get_task(ex.task)
        table = None
        if type(task).marginals is Task.marginals and T.count_answers(ex) <= T.ENUMERATION_LIMIT:
            table = task.answer_table(ex.meta).ids  # enumerated once per prompt
        problem = _Problem(ex, T.answer_length(ex.task, ex.size), table)
        self._problems[prompt] = problem
        self._problem_bytes += problem.nbytes
        while len(self._problems) > 1 and (self._problem_bytes > TABLE_CACHE_BYTES or len(self._problems) > 4096):
            _, old = self._problems.popitem(last=False)
            self._problem_bytes -= old.nbytes
        return problem


def _skip_pads(row: Sequence[int], pad_id: int) -> int:
    i = 0
    while i < len(row) and row[i] == pad_id:
        i += 1
    return i


def _task_tokenizer() -> Any:
    from dllm.models.text.task_tokenizer import task_tokenizer

    return task_tokenizer()


def oracle_prompts(examples: Sequence[T.Example]) -> list[list[int]]:
    """Token ids of ``[BOS] <task> <args...> [SEP]`` for each example (ids = vocabulary indices)."""
    return [[T.word_id(w) for w in T.prompt_words(ex)] for ex in examples]


def score_generation(examples: Sequence[T.Example], out: Any) -> list[bool]:
    """Exact score (``tasks.score``) of each row of a ``GenerationOutput`` (or generated ids [B, G]).

    A generated region shorter than the task's answer region (``gen_length`` = the content length,
    as in the theory tests) is EOS-padded first; answers have a fixed length per task and size, so
    this only supplies the EOS that the canvas left out.
    """
    gen = out.generated if hasattr(out, "generated") else out
    rows = gen.tolist() if isinstance(gen, torch.Tensor) else [list(r) for r in gen]
    if len(rows) != len(examples):
        raise ValueError(f"{len(examples)} examples but {len(rows)} generated rows")
    scores = []
    for ex, row in zip(examples, rows):
        words = T.words_of(row)
        words += [T.EOS] * (T.answer_length(ex.task, ex.size) - len(words))
        scores.append(T.score(ex, words))
    return scores


__all__ = ["NEG_LOGIT", "OracleLM", "oracle_prompts", "score_generation"]

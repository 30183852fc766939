"""``dllm stress``: a ParallelBench-style sweep (arXiv 2510.04767) of samplers x parallelism x tasks.

For every setting of the grid (``stress.grid``: a sampler, its options, k tokens per step for
fixed-step samplers, a block length, a KV-cache policy) and every task, the first ``per_size`` test
examples of each of the task's sizes are decoded greedily, one batch per answer length, and scored
exactly; each (setting, task) is one *cell* with per-sample outcomes (``stress.metrics.Cell``:
correct, forwards, tokens, content tokens, Kendall tau of the unmasking order). The summary (``stress.report``) gives
the leaderboard (max tokens per step at >= 80 / 75 / 70 % mean accuracy), the parallelizability
centre of mass, the per-sample oracle and per-task accuracy vs parallelism; ``stress.plots`` draws
accuracy vs tokens per step per task and a heatmap of max TPS at 80 %.

Resumable: ``OUT/stress.json`` is rewritten atomically after every cell, so an interruption loses
only the cell in progress; a rerun with ``resume=True`` and the same model, dtype, tasks, examples,
grid, caches, rows per call (``max_batch``) and device type skips the finished cells, and any other file is refused
with the differences named. Each cell seeds its own randomness from its name (``cell_seed``), so a
resumed run equals an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from dllm import tasks as T
from dllm.scoring.exact_match import RowSteps, check_test_range, decode_and_score, eval_examples, load_model
from dllm.eval.interrupt import finished, until_interrupted
from dllm.eval.stress.grid import (
    DEFAULT_CACHES, DEFAULT_GRID, Setting, build_grid, caches_shown, cell_key, check_engine, parse_block_lengths,
    parse_caches,
)  # fmt: skip
from dllm.eval.stress.metrics import Cell, unmasking_tau
from dllm.eval.stress.store import (DEFAULT_MAX_BATCH, FORMAT, StressStore, dump_two_levels,
                                    rounded)
from dllm.options import check_int
from dllm.registry import parse_spec
from dllm.samplers import samplers

RESULT_FILE = "stress.json"  # header + every cell with its per-sample outcomes (the resume file) + summary
SUMMARY_FILE = "stress-summary.json"  # header, grid and the summary's members, 4 decimals (small enough to keep)


@dataclass(frozen=True)
class StressConfig:
    """What a sweep decodes; all of it must match for a resume (``header``)."""

    model: str  # the model's name, as recorded (``oracle``, ``tiny-llada``, a path)
    grid: tuple[str, ...] = DEFAULT_GRID  # ``--grid`` entries (``stress.grid``)
    block_lengths: tuple[int, ...] = (0,)  # 0: one block of the answer length
    tasks: Optional[tuple[str, ...]] = None  # None: the PB-mini suite
    per_size: int = 4  # test examples per task size
    # rows per generate call: a deterministic model and sampler give the same cells at any value, but
    # random draws (the ``random`` sampler, the oracle's logit noise) are made per call, so they differ
    max_batch: int = DEFAULT_MAX_BATCH
    dtype: Optional[str] = None  # the model's --dtype, as given (None: not recorded; the oracle has none)
    caches: tuple[str, ...] = DEFAULT_CACHES  # ``--caches``: KV-cache policy specs crossed with every setting
    device: str = "cpu"  # the device type the cells are decoded on (``--device``'s; cpu and cuda kernels round
    #   differently, so their cells may differ: a resume must not mix them)

    def __post_init__(self) -> None:
        check_int("per_size", self.per_size, 1, hint=" (test examples per task size)")
        check_test_range(self.per_size)  # the split holds 50 per size: refused now, not after the model loads
        check_int("max_batch", self.max_batch, 1)
        object.__setattr__(self, "block_lengths", parse_block_lengths(self.block_lengths))
        object.__setattr__(self, "caches", parse_caches(self.caches))  # bad specs name the valid policies
        object.__setattr__(self, "device", device_type(self.device))
        names = self.tasks if self.tasks else T.suite_task_names()
        resolved = tuple(T.get_task(n).name for n in names)  # unknown names list the valid ones
        if len(set(resolved)) != len(resolved):
            raise ValueError(f"tasks list a task twice: {list(names)}")
        object.__setattr__(self, "tasks", resolved)
        self.settings  # noqa: B018 - build (and so check) the grid now, before any decoding

    @cached_property
    def settings(self) -> list[Setting]:
        return build_grid(self.grid, self.block_lengths, self.caches)

    @property
    def cache_shown(self) -> bool:
        """Whether the labels name the cache (not the default ``none`` alone)."""
        return caches_shown(self.caches)

    @cached_property
    def examples(self) -> dict[str, list[T.Example]]:
        return {t: eval_examples([t], per_size=self.per_size) for t in self.tasks}

    def sample_sizes(self) -> dict[str, list[int]]:
        """Per task, the size of each example in order: what every cell of the task holds (``Cell.sizes``)."""
        return {t: [ex.size for ex in exs] for t, exs in self.examples.items()}

    def header(self) -> dict[str, Any]:
        """The resume file's identity: a resume must match it exactly."""
        return {"format": FORMAT, "model": self.model, "split_version": T.SPLIT_VERSION,
                "tasks": list(self.tasks), "per_size": self.per_size,
                "settings": [s.label for s in self.settings], "caches": list(self.caches),
                "max_batch": self.max_batch, "dtype": self.dtype, "device": self.device}


def device_type(device: Optional[str]) -> str:
    """The type of a ``--device`` value (None: the CLI's default, cpu): ``cuda:1`` -> ``cuda``. ValueError
    naming the value when torch cannot parse it."""
    if device is None:
        return "cpu"
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(f"--device must be a torch device such as cpu, cuda or cuda:N, got {device!r}") from None


def cell_seed(key: str) -> int:
    """A stable 31-bit seed per cell (SHA-256, not Python's salted hash)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


@torch.no_grad()
def decode_cell(model, setting: Setting, task: str, examples: Sequence[T.Example], *,
                max_batch: int = DEFAULT_MAX_BATCH, seed: int = 0, keep_rows: bool = False) -> Cell:
    """Decode ``examples`` (one task) with one setting, greedily, in batches of one answer length
    (``decode_and_score`` with ``record=True``, batches cut in the examples' order).

    A sample's forwards (``Cell.nfe``) are the steps that changed its row (``RowSteps``) times the
    forwards per step of its call: the forwards it takes decoded alone, since every sampler decides
    per row (samplers with verification forwards run one row per call for that reason).
    keep_rows: also keep each sample's generated row and commit steps (``--metrics parallelbench``).
    """
    if hasattr(model, "reseed") and getattr(model, "noise_std", 0) > 0:
        model.reseed(seed)  # the oracle's logit noise: the same draws whatever ran before
    # a sampler that verifies drafts in extra forwards skips them when no row of the batch needs
    # them: one row per call keeps every sample's forward count its own
    per_call = 1 if samplers.get(setting.sampler).needs_variants else max_batch
    tally = decode_and_score(model, examples, setting.decode, max_batch=per_call, by_length=False, seed=seed,
                             record=True)
    out = [tally.outcomes[i] for i in range(len(examples))]
    lengths = [T.answer_length(ex.task, ex.size) for ex in examples]
    taus = [unmasking_tau(o.trace) for o in out]
    return Cell(setting.label, task, [ex.size for ex in examples], [o.correct for o in out],
                [o.forwards for o in out], lengths, [o.content for o in out],
                [None if t is None else round(t, 6) for t in taus],  # stored as is: a resumed cell compares equal
                tally.forwards, tally.seconds,
                [list(o.row) for o in out] if keep_rows else None, [list(o.trace) for o in out] if keep_rows else None)


@dataclass
class StressResult:
    config: StressConfig
    cells: dict[str, Cell]  # cell_key -> cell
    computed: int  # cells decoded by this call (the rest came from the resume file)

    def cell(self, setting: Setting, task: str) -> Cell:
        return self.cells[cell_key(setting, task)]


def run_stress(model, config: StressConfig, path: "str | Path", *, resume: bool = False,
               progress: bool = True, on_cell: Optional[Callable[[Cell], None]] = None,
               keep_rows: bool = False) -> StressResult:
    """Decode every cell of ``config`` not yet in ``path`` (with ``resume``), saving after each.

    on_cell: called with each newly decoded cell after it is saved (a KeyboardInterrupt raised there
        or anywhere else leaves every finished cell in the file).
    keep_rows: keep every sample's generated row and commit steps in the cells (``--metrics
        parallelbench`` rescores and reorders from them).
    """
    from tqdm.auto import tqdm

    from dllm.eval.bench.choose.fast import cannot_run

    refused = {s.spec: why for s in config.settings if (why := cannot_run(model, s.spec)) is not None}
    if refused:  # before any decoding, not at the first cell of such a sampler
        raise ValueError("the grid has samplers this model cannot run: "
                         + "; ".join(f"{spec}: {why}" for spec, why in refused.items()))
    check_engine(model, config.settings, [ex for t in config.tasks for ex in config.examples[t]])
    store = StressStore.open(Path(path), config.header(), resume=resume, sizes=config.sample_sizes())
    todo = [(s, t) for s in config.settings for t in config.tasks if cell_key(s, t) not in store.cells]
    total = len(config.settings) * len(config.tasks)
    computed = 0
    if todo:  # warm-up, not recorded: first-call costs would otherwise go to the first cell's wall time
        setting, task = todo[0]
        decode_cell(model, setting, task, config.examples[task][:1], seed=0)
    with tqdm(total=total, initial=total - len(todo), disable=not progress, desc="stress", unit="cell") as bar:
        for setting, task in todo:
            bar.set_postfix_str(f"{setting.label} | {task}")
            key = cell_key(setting, task)
            cell = decode_cell(model, setting, task, config.examples[task], max_batch=config.max_batch,
                               seed=cell_seed(key), keep_rows=keep_rows)
            store.add(key, cell)
            computed += 1
            bar.update(1)
            if on_cell is not None:
                on_cell(cell)
    return StressResult(config, store.cells, computed)


def is_oracle(name: str) -> bool:
    """``oracle`` or ``oracle:OPTIONS``: the weightless exact-posterior model (no dtype)."""
    return name == "oracle" or name.startswith("oracle:")


def load_stress_model(name: str, dtype: Optional[str] = None, device: Optional[str] = None):
    """``load_model``, plus ``oracle:noise_std=S,seed=N``: the oracle with i.i.d. logit noise
    (ParallelBench's unbiased model; ties then break at random per position)."""
    if name.startswith("oracle:"):
        from dllm.models.oracle import OracleLM

        _, options = parse_spec(name, "oracle model")
        try:
            model = OracleLM(**options)
        except TypeError as err:
            raise ValueError(f"model {name!r}: {err}; valid oracle options: noise_std, seed, invalid") from None
        return model.to(device) if device else model
    return load_model(name, dtype, device)


def run_stress_cli(args) -> int:
    """``dllm stress``: check everything, load the model, sweep, print and save the tables and plots.
    Ctrl-C: the finished cells stay in ``stress.json`` (``--resume`` continues), status 130."""
    from dllm.eval.stress.parallelbench import parse_metrics

    pb = parse_metrics(getattr(args, "metrics", "dllm"))  # checked before the model loads
    config = StressConfig(model=args.model, grid=tuple(args.grid or DEFAULT_GRID),
                          block_lengths=parse_block_lengths(args.block_lengths),
                          tasks=tuple(args.tasks) if args.tasks else None, per_size=args.per_size,
                          dtype=None if is_oracle(args.model) else args.dtype,
                          caches=parse_caches(getattr(args, "caches", "none")),
                          device=device_type(getattr(args, "device", None)))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a directory (stress writes {RESULT_FILE}, "
                         f"stress.txt and PNGs into it)")
    path = out / RESULT_FILE
    StressStore.open(path, config.header(), resume=args.resume, sizes=config.sample_sizes())  # before loading
    def saved() -> str:
        done = len(json.loads(path.read_text())["cells"]) if path.exists() else 0
        return finished(done, "cell", str(path), "; rerun with --resume to continue")

    return until_interrupted(lambda: _sweep_and_report(args, config, out, path, pb), saved)


def _sweep_and_report(args, config: StressConfig, out: Path, path: Path, pb=None) -> int:
    from dllm.eval.stress.plots import plot_all
    from dllm.eval.stress.report import format_report, summarize

    model = load_stress_model(args.model, args.dtype, args.device)
    result = run_stress(model, config, path, resume=args.resume, progress=not args.no_progress,
                        keep_rows=pb is not None)
    summary = summarize(config, result.cells)
    text = format_report(config, summary)
    if pb is not None:  # --metrics parallelbench: ParallelBench's definitions (stress.parallelbench)
        from dllm.eval.stress.parallelbench import summarize_parallelbench
        from dllm.eval.stress.report import format_parallelbench

        summary["parallelbench"] = summarize_parallelbench(config, result.cells, pb)
        text = format_parallelbench(config, summary["parallelbench"])
    print(text)
    store = StressStore(path, config.header(), result.cells, summary)
    store.save()
    (out / "stress.txt").write_text(text + "\n")
    brief = {"header": config.header(), "grid": list(config.grid), "block_lengths": list(config.block_lengths),
             "caches": list(config.caches), **rounded(summary)}
    (out / SUMMARY_FILE).write_text(dump_two_levels(brief))
    written = [str(path), str(out / SUMMARY_FILE), str(out / "stress.txt")]
    try:
        written += [str(p) for p in plot_all(summary, out, title=args.model)]
    except ImportError:
        print("install matplotlib for the plots: pip install dllm[eval]")
    print("wrote " + ", ".join(written))
    return 0


__all__ = ["FORMAT", "RowSteps", "StressConfig", "StressResult", "StressStore", "cell_key", "cell_seed",
           "decode_cell", "dump_two_levels", "is_oracle", "load_stress_model", "rounded", "run_stress",
           "run_stress_cli"]

"""``dllm compare``: samplers side by side on the stress tasks, one model, one run.

For every sampler spec and every task, the first ``n`` test examples (spread over the task's sizes)
are decoded as one block of the task's answer length (or blocks of ``block_length``), one batch per
task and answer length (prompts of >= 128 tokens: batches of similar length,
``exact_match.length_batches``), and scored exactly (``exact_match.decode_and_score``). Per sampler
the table reports accuracy, mean NFE per example, forwarded tokens, tokens per forward (content up
to EOS, and total), tokens per second, wall time and peak memory (with ``repeats`` > 1: every
sampler timed ``repeats`` times in interleaved rounds, the median wall time reported, every one in
``extra["wall_times"]``). Results go to JSON and a PNG of the accuracy / tokens-per-forward plane
with the Pareto front marked.

A sampler spec is a ``DecodeSettings`` (``dllm.settings``): the registry's ``name`` or
``name:key=value,key=value``; its options go to ``generate`` (sampler options), except ``k``
(fixed-step samplers only), which sets ``steps = ceil(L_ans / k)``, i.e. k tokens per step, and
``cache`` (a cache policy spec; several options in parentheses). Examples: ``low_confidence`` (one
token per step), ``low_confidence:k=2``, ``threshold:threshold=0.8``,
``fast:cache=(dual:look_back=16,look_ahead=16)``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from dllm import tasks as T
from dllm.engine.graphs import check_graphs_option
from dllm.eval.interrupt import finished, until_interrupted
from dllm.inputs import model_device
from dllm.models.core.layer.moe import ExpertCounter, count_experts, has_experts
from dllm.options import check_int, check_optional_int
from dllm.scoring.exact_match import decode_and_score, load_model
from dllm.settings import DecodeSettings

DEFAULT_SAMPLERS = (
    "low_confidence", "low_confidence:k=2", "threshold", "fast", "factor", "eb:gamma=0.1", "localleap",
    "hierarchy", "klass", "dus", "prophet",
)  # fmt: skip


@dataclass
class SamplerResult:
    label: str
    accuracy: float
    per_task: dict[str, float]
    examples: int
    nfe_per_example: float
    forwarded_tokens: int
    tokens_per_forward: float
    content_tokens_per_forward: float
    tokens_per_second: float
    wall_time: float
    # peak memory of the run (dllm.eval.bench.timing: CUDA allocations, or on CPU the process's peak resident
    # set, model and interpreter included); None where it cannot be measured
    peak_memory_mb: Optional[float] = None
    # mixture-of-experts models (LLaDA 2): distinct experts per MoE layer per forward, averaged over layers
    # and forwards (``dllm.models.core.layer.moe.count_experts``); None for a dense model
    experts_per_forward: Optional[float] = None
    pareto: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def check_split(task_names: Sequence[str], n: int) -> None:
    """ValueError unless every task's test split (``T.TEST_SPLIT_SIZE`` per default size) holds ``n``
    examples (instances past it are not held out of training) and no task is listed twice (it would be
    decoded twice and weigh double in the overall accuracy)."""
    resolved = [T.get_task(name).name for name in task_names]  # unknown names list the valid ones
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"tasks list a task twice: {list(task_names)}")
    for name in task_names:
        task = T.get_task(name)
        most = T.TEST_SPLIT_SIZE * len(task.default_sizes)
        if n > most:
            raise ValueError(f"n={n} test examples per task: the test split of {task.name!r} holds {most} "
                             f"({T.TEST_SPLIT_SIZE} per size {list(task.default_sizes)}); give n <= {most}")


def task_examples(task_names: Sequence[str], n: int) -> list[T.Example]:
    """The first ``n`` test examples of each task, taken round-robin over its default sizes (so that
    ``n`` examples cover the size range), tasks in the given order. ValueError when a task's test split
    holds fewer than ``n`` (``check_split``)."""
    check_split(task_names, n)
    out = []
    for name in task_names:
        task = T.get_task(name)
        sizes = list(task.default_sizes)
        per = max(1, -(-n // len(sizes)))
        pool = [ex for size in sizes for ex in T.test_split(task.name, size, n=per)]
        # round-robin over sizes so that n examples cover the range
        by_size = defaultdict(list)
        for ex in pool:
            by_size[ex.size].append(ex)
        picked = []
        while len(picked) < n and any(by_size.values()):
            for size in sizes:
                if by_size[size] and len(picked) < n:
                    picked.append(by_size[size].pop(0))
        out.extend(picked)
    return out


def run_sampler(model, spec: DecodeSettings, examples: Sequence[T.Example], *, block_length: Optional[int],
                max_batch: int = 64, progress=None, cuda_graphs: Any = False) -> SamplerResult:
    from dllm.eval.bench.timing import peak_memory_mb, reset_peak_memory

    device = model_device(model)
    can_peak = reset_peak_memory(device)
    # one batch per (task, answer length): see decode_and_score's ``by_task``
    setting = replace(spec, block_length=block_length) if block_length is not None else spec
    with expert_counter(model, cuda_graphs is False) as experts:
        tally = decode_and_score(model, examples, setting, by_task=True, max_batch=max_batch, progress=progress,
                                 cuda_graphs=cuda_graphs)
    peak = peak_memory_mb(device) if can_peak else None
    total, rows, wall = tally.examples, tally.row_forwards, tally.seconds
    return SamplerResult(
        label=spec.label, accuracy=sum(tally.correct.values()) / total, per_task=tally.accuracy,
        examples=total, nfe_per_example=rows / total, forwarded_tokens=tally.forwarded_tokens,
        tokens_per_forward=tally.generated_tokens / rows, content_tokens_per_forward=tally.content_tokens / rows,
        tokens_per_second=tally.generated_tokens / wall if wall > 0 else float("inf"), wall_time=wall,
        peak_memory_mb=None if peak is None else round(peak, 1),
        experts_per_forward=None if experts is None else round(experts.mean_distinct(), 2),
        extra={"solved": "".join("1" if tally.solved[i] else "0" for i in range(total))},  # per example, in order
    )


@contextlib.contextmanager
def expert_counter(model, on: bool = True) -> Iterator[Optional[ExpertCounter]]:
    """``count_experts(model)`` for a mixture-of-experts model, None for a dense one or when not ``on``
    (with CUDA graphs: counting runs the experts' loop, which a capture cannot hold, so no experts/fwd)."""
    if not on or not has_experts(model):
        yield None
        return
    with count_experts(model) as counter:
        yield counter


def mark_pareto(results: list[SamplerResult]) -> None:
    """A result is on the front if no other has accuracy >= and TPF >= with one strictly greater."""
    for r in results:
        r.pareto = not any(
            (o.accuracy >= r.accuracy and o.tokens_per_forward >= r.tokens_per_forward)
            and (o.accuracy > r.accuracy or o.tokens_per_forward > r.tokens_per_forward)
            for o in results if o is not r
        )


def check_compare(specs: Sequence[str], n: int, block_length: Optional[int],
                  task_names: Optional[Sequence[str]] = None) -> list[DecodeSettings]:
    """The parsed specs; raises ValueError on anything that would fail later in the run (``task_names``:
    the tasks, None for the PB-mini suite; each test split must hold ``n`` examples)."""
    check_int("n", n, 1, hint=" (test examples per task)")
    check_optional_int("block_length", block_length, 1)
    check_split(list(task_names) if task_names else T.suite_task_names(), n)
    parsed = [DecodeSettings.parse(s) for s in specs]  # the text form; check(): generate's own checks
    for spec in parsed:
        spec.check()
    return parsed


def median_wall(runs: Sequence[SamplerResult]) -> SamplerResult:
    """One result for repeated runs of the same sampler on the same examples: the first run's counts,
    the median wall time (and tokens/s from it); every wall time in ``extra["wall_times"]``.
    RuntimeError if the runs disagree on anything but time (a sampler that is not deterministic)."""
    first = runs[0]
    for r in runs[1:]:
        if (r.accuracy, r.forwarded_tokens, r.nfe_per_example, r.extra.get("solved")) != (
                first.accuracy, first.forwarded_tokens, first.nfe_per_example, first.extra.get("solved")):
            raise RuntimeError(f"{first.label}: repeated runs differ (accuracy {first.accuracy} vs {r.accuracy}, "
                               f"forwarded tokens {first.forwarded_tokens} vs {r.forwarded_tokens}); "
                               "timing them together would mix different work")
    walls = [r.wall_time for r in runs]
    wall = statistics.median(walls)
    tps = first.tokens_per_second * first.wall_time / wall if wall > 0 else float("inf")
    peaks = [r.peak_memory_mb for r in runs if r.peak_memory_mb is not None]
    return SamplerResult(**{**asdict(first), "wall_time": wall, "tokens_per_second": tps,
                            "peak_memory_mb": max(peaks) if peaks else None,
                            "extra": {**first.extra, "wall_times": walls}})


def compare(model, specs: Sequence[str], task_names: Optional[Sequence[str]], n: int, *,
            block_length: Optional[int] = None, show_progress: bool = True, repeats: int = 1,
            runs: Optional[list[list[SamplerResult]]] = None, cuda_graphs: Any = False) -> list[SamplerResult]:
    """Every sampler on the same examples, ``repeats`` interleaved rounds; one row per sampler
    (``summarize``). ``runs``: a list the finished runs are appended to as they end (one list per
    sampler), so a caller interrupted midway keeps them. ``cuda_graphs``: ``generate``'s, for every
    sampler (True: the cached forwards replayed as CUDA graphs, a CUDA model; checked before any run)."""
    from tqdm.auto import tqdm

    check_int("repeats", repeats, 1, hint=" (timed runs per sampler)")
    parsed = check_compare(specs, n, block_length, task_names)
    check_graphs_option(cuda_graphs, model_device(model))
    names = list(task_names) if task_names else list(T.suite_task_names())
    examples = task_examples(names, n)
    # warm-up (not recorded): first-call costs (allocations, the oracle's answer tables) would
    # otherwise be charged to whichever sampler runs first
    run_sampler(model, parsed[0], examples, block_length=block_length, cuda_graphs=cuda_graphs)
    runs = [] if runs is None else runs
    runs.extend([] for _ in parsed)
    with tqdm(total=repeats * len(parsed) * len(examples), disable=not show_progress, desc="compare",
              unit="ex") as bar:
        for _ in range(repeats):  # interleaved rounds: a change in the machine's load hits every sampler
            for spec, mine in zip(parsed, runs):
                bar.set_postfix_str(spec.label)
                mine.append(run_sampler(model, spec, examples, block_length=block_length, progress=bar,
                                        cuda_graphs=cuda_graphs))
    return summarize(runs)


def summarize(runs: Sequence[Sequence[SamplerResult]]) -> list[SamplerResult]:
    """One row per sampler that finished a run (the median wall time over its runs), Pareto-marked."""
    results = [median_wall(r) if len(r) > 1 else r[0] for r in runs if r]
    mark_pareto(results)
    return results


def format_results(results: Sequence[SamplerResult]) -> str:
    """The compare table; a mixture-of-experts model's rows add ``experts/fwd`` (distinct experts per MoE
    layer per forward) beside TPF, to show how many experts committing more tokens per step wakes."""
    width = max(len(r.label) for r in results) + 2
    moe = any(r.experts_per_forward is not None for r in results)
    head = (f"{'sampler':<{width}}{'acc %':>7}{'NFE/ex':>8}{'fwd tokens':>12}{'TPF':>7}"
            f"{'TPF(content)':>14}{'experts/fwd' if moe else '':>{13 if moe else 0}}{'tok/s':>9}{'wall s':>8}{'peak MiB':>10}  front")
    lines = [head, "-" * len(head)]
    for r in results:
        experts = ("-" if r.experts_per_forward is None else f"{r.experts_per_forward:.2f}") if moe else ""
        lines.append(
            f"{r.label:<{width}}{100 * r.accuracy:7.1f}{r.nfe_per_example:8.2f}{r.forwarded_tokens:12d}"
            f"{r.tokens_per_forward:7.2f}{r.content_tokens_per_forward:14.2f}{experts:>{13 if moe else 0}}"
            f"{r.tokens_per_second:9.1f}"
            f"{r.wall_time:8.2f}{'-' if r.peak_memory_mb is None else f'{r.peak_memory_mb:.0f}':>10}"
            f"  {'*' if r.pareto else ''}"
        )
    return "\n".join(lines)


def plot_results(results: Sequence[SamplerResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for r in results:
        ax.scatter(r.tokens_per_forward, 100 * r.accuracy, s=50,
                   marker="*" if r.pareto else "o", color="tab:red" if r.pareto else "tab:blue")
        ax.annotate(r.label, (r.tokens_per_forward, 100 * r.accuracy), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    front = sorted((r for r in results if r.pareto), key=lambda r: r.tokens_per_forward)
    ax.plot([r.tokens_per_forward for r in front], [100 * r.accuracy for r in front], "--", color="tab:red",
            label="Pareto front")
    ax.set_xlabel("tokens per forward (per row)")
    ax.set_ylabel("exact-match accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_compare(args) -> int:
    """``dllm compare``: the table, compare.json and compare.png in ``--out``; Ctrl-C keeps the samplers
    that finished a run (exit status 130)."""
    specs = args.samplers or DEFAULT_SAMPLERS
    check_compare(specs, args.n, args.block_length, args.tasks)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; give a directory (compare writes compare.json "
                         f"and compare.png into it)")
    out.mkdir(parents=True, exist_ok=True)
    runs: list[list[SamplerResult]] = []

    def body() -> int:
        model = load_model(args.model, args.dtype, args.device)
        compare(model, specs, args.tasks, args.n, block_length=args.block_length,
                show_progress=not args.no_progress, repeats=args.repeats, runs=runs,
                cuda_graphs=args.cuda_graphs)
        save(summarize(runs))
        return 0

    def save(results: list[SamplerResult], interrupted: bool = False) -> None:
        print(format_results(results))
        payload = {"model": args.model, "n_per_task": args.n, "tasks": args.tasks or "all",
                   "block_length": args.block_length, "repeats": args.repeats, "interrupted": interrupted,
                   "cuda_graphs": args.cuda_graphs,
                   "results": [asdict(r) for r in results]}
        (out / "compare.json").write_text(json.dumps(payload, indent=2))
        try:
            plot_results(results, out / "compare.png", f"{args.model}: accuracy vs tokens per forward")
            print(f"wrote {out / 'compare.json'} and {out / 'compare.png'}")
        except ImportError:
            print(f"wrote {out / 'compare.json'} (install matplotlib for the plot: pip install dllm[eval])")

    def finish() -> str:
        results = summarize(runs)
        if not results:
            return "no sampler finished a run; nothing written"
        save(results, interrupted=True)
        return finished(len(results), "sampler row", str(out / "compare.json"))

    return until_interrupted(body, finish)

"""``dllm bench spec --trees chain,ddtree,taps --budgets 16,32,64,128``: draft trees vs their budget.

DFlash drafts K = B - 1 positions per round; a tree builder (``dllm.drafters.tree``) turns its
per-position distributions into a tree of ``budget`` nodes that the target verifies in one forward
(``tree=`` of ``speculative_generate``). A bigger tree accepts more per round and costs a wider
forward; this benchmark measures that trade-off at batch 1 and picks a budget per builder without
looking at the prompts it reports on:

1. two disjoint prompt splits of the tasks (default: the long-answer suite): *held-out* = test
   instances n..2n-1 of every task size, *reported* = instances 0..n-1 (what ``bench spec`` runs);
2. held-out, greedy: every builder x budget; per builder the budget with the most tokens/s is
   *chosen*;
3. reported, at every temperature: every builder x budget (the chosen budget marked), the no-tree
   DFlash chain (``tree=None``) and plain ``target.generate``, the baseline of ``speedup``.

Within a split every configuration decodes prompt i in turn before prompt i + 1 (as ``bench spec``),
so a busy machine slows them alike. A ``TreeRow`` per (split, temperature, configuration): ``tau`` =
generated tokens / target forwards (prefill included), ``tau_round`` = mean tokens per verification
round, ``width`` = mean tokens per verification forward, measured (1 + the tree's nodes: 1 + budget
for ddtree / taps, 1 + min(budget, K) for chain, B without a tree, 1 for ``generate``), target
forwards, tokens/s, ``speedup`` over ``generate``, ``greedy_match`` (T = 0: token-identical to
``generate``; every configuration is lossless) and ``chosen``.

Also the *cost curve* of one target forward: batch 1, a warm cache holding ``--prefix`` tokens, T =
1 + N new tokens under a 4-D mask (as tree verification runs it), N in ``COST_SIZES``, the median of
``--cost-repeats`` calls; a least-squares line t(N) = a + b N, with ``b / a`` the relative cost of a
node. ``--png``: tau and tokens/s vs budget per builder (greedy, reported split).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch

from dllm import tasks as T
from dllm.eval.bench_spec import (Row, Runner, Sample, _device, _reason, _split, _task_vocab, _timed,
                                  check_temperatures, format_table, hf_runner, loop_runner, summarize)
from dllm.eval.timing import sync

DEFAULT_BUILDERS: tuple[str, ...] = ("chain", "ddtree", "taps")
DEFAULT_BUDGETS: tuple[int, ...] = (16, 32, 64, 128)
COST_SIZES: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128)
BASELINES: tuple[str, ...] = ("generate", "no-tree")  # target.generate; the DFlash chain without a tree
SPLITS: tuple[str, ...] = ("held-out", "reported")
WARMUP_TOKENS = 8
COLUMNS = ("builder", "budget", "temperature", "tau", "tau_round", "width", "target_forwards", "tokens_per_s",
           "speedup", "accuracy", "greedy_match", "chosen", "status")


def tree_builder_names() -> list[str]:
    from dllm.drafters.tree import tree_builders

    return tree_builders.names()


def check_builders(names: Sequence[str]) -> None:
    valid = tree_builder_names()
    bad = [b for b in names if b not in valid]
    if bad or not names:
        raise ValueError(f"unknown tree builder(s) {bad or list(names)!r}; valid builders: {', '.join(valid)}")
    if len(set(names)) != len(names):
        raise ValueError(f"each tree builder may appear once, got {list(names)}; valid builders: {', '.join(valid)}")


def check_budgets(budgets: Sequence[Any]) -> None:
    bad = [b for b in budgets if isinstance(b, bool) or not isinstance(b, int) or b < 1]
    if bad or not budgets:
        raise ValueError(f"budgets must be integers >= 1 (draft nodes per tree, e.g. 16,32,64,128), "
                         f"got {list(budgets)!r}")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"each budget may appear once, got {list(budgets)}")


@dataclass(frozen=True)
class Config:
    """One decoding configuration: ``builder`` a tree builder name (with ``budget``), or a baseline
    (``generate``: target.generate; ``no-tree``: the DFlash chain, ``tree=None``)."""

    builder: str
    budget: Optional[int] = None

    @property
    def label(self) -> str:
        return self.builder if self.budget is None else f"{self.builder}:budget={self.budget}"

    @property
    def tree(self) -> Optional[str]:
        return None if self.builder in BASELINES else self.label


def configs_for(builders: Sequence[str], budgets: Sequence[int], baselines: bool = True) -> list[Config]:
    """The baselines (generate, no-tree) first, then every builder x budget."""
    base = [Config(b) for b in BASELINES] if baselines else []
    return base + [Config(b, n) for b in builders for n in budgets]


@dataclass
class TreeRow(Row):
    """A ``bench_spec.Row`` (``method`` = the configuration's label) of one split."""

    split: str = ""
    builder: str = ""
    budget: Optional[int] = None
    width: Optional[float] = None  # mean tokens per verification forward (the prefill not counted)
    chosen: bool = False
    greedy_diffs: list[dict[str, Any]] = field(default_factory=list)  # T = 0 only: see ``greedy_diffs``


# ---- the splits ----------------------------------------------------------------------------------
def reported_examples(tasks: Sequence[str], n: int) -> list[T.Example]:
    """Test instances 0..n-1 of every default size of every task (what ``bench spec`` reports on)."""
    return [ex for t in tasks for ex in T.test_split(t, None, n=n)]


def held_out_examples(tasks: Sequence[str], n: int) -> list[T.Example]:
    """Test instances n..2n-1 of every default size of every task: disjoint from ``reported_examples``
    (``test_split`` lists sizes one after another, so the slice is taken per size)."""
    return [ex for t in tasks for s in T.get_task(t).default_sizes for ex in T.test_split(t, s, n=2 * n)[n:]]


# ---- runners -------------------------------------------------------------------------------------
def tree_runner(target, drafter, block_size: int, tree: str) -> Runner:
    """``speculative_generate(..., tree=tree)`` at batch 1 (``bench_spec.loop_runner`` with a tree)."""
    from dllm.drafters.loop import speculative_generate
    from dllm.drafters.tree import make_tree_builder
    from dllm.models.task_tokenizer import task_tokenizer

    make_tree_builder(tree)  # a bad spec fails here, not inside the first timed call
    device = _device(target)
    tokenizer = task_tokenizer()

    def run(prompt: list[int], temperature: float, max_new: int, seed: int) -> Sample:
        out, wall = _timed(device, lambda: speculative_generate(
            target, drafter, [prompt], max_new_tokens=max_new, temperature=temperature, top_p=1.0, top_k=0,
            block_size=block_size, seed=seed, tokenizer=tokenizer, tree=tree))
        return Sample(out.generated[0], out.target_forwards, out.drafter_forwards, out.acceptance[0], wall)

    return run


def make_runner(target, drafter, config: Config, block_size: int) -> Runner:
    if config.builder == "generate":
        return hf_runner(target)
    if config.builder == "no-tree":
        return loop_runner(target, drafter, block_size)
    return tree_runner(target, drafter, block_size, config.label)


@contextmanager
def widths(module: torch.nn.Module) -> Iterator[list[int]]:
    """Records the input width (tokens) of every forward call of ``module``."""
    seen: list[int] = []

    def hook(m, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            seen.append(int(ids.shape[-1]))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


# ---- one split -----------------------------------------------------------------------------------
def run_split(
    target,
    drafter,
    configs: Sequence[Config],
    examples: Sequence[T.Example],
    *,
    split: str,
    temperatures: Sequence[float] = (0.0,),
    seed: int = 0,
    max_new_tokens: Optional[int] = None,
    block_size: Optional[int] = None,
    progress: bool = True,
    warmup: bool = True,
) -> list[TreeRow]:
    """Every configuration on every example at every temperature, configurations taking turns per
    prompt; one ``TreeRow`` per (T, configuration), in that order. ``block_size``: default the
    drafter's. A configuration that fails is skipped with the reason (the others go on)."""
    from tqdm.auto import tqdm

    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    check_temperatures(temperatures)
    if not examples:
        raise ValueError("run_split needs at least one example")
    if len({c.label for c in configs}) != len(configs):
        raise ValueError(f"each configuration may appear once, got {[c.label for c in configs]}")
    block = block_size or drafter.block_size
    vocab = _task_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    lengths = [max_new_tokens or T.answer_length(ex.task, ex.size) for ex in examples]
    runners: dict[str, Runner] = {}
    skipped: dict[str, str] = {}
    for c in configs:
        try:
            runners[c.label] = make_runner(target, drafter, c, block)
            if warmup:
                runners[c.label](prompts[0], 0.0, WARMUP_TOKENS, 0)
        except Exception as err:  # noqa: BLE001  one configuration's failure never ends the run
            skipped[c.label] = _reason(err)
    rows: list[TreeRow] = []
    bar = tqdm(total=len(temperatures) * len(examples), disable=not progress, desc=f"bench trees ({split})",
               unit="prompt")
    for temp in temperatures:
        samples: dict[str, list[Sample]] = {c.label: [] for c in configs}
        seen: dict[str, list[int]] = {c.label: [] for c in configs}
        for i, (prompt, max_new) in enumerate(zip(prompts, lengths)):
            for c in configs:
                if c.label in skipped:
                    continue
                bar.set_postfix_str(f"T={temp:g} {c.label}")
                try:
                    with widths(target) as w:
                        samples[c.label].append(runners[c.label](prompt, float(temp), max_new, seed + i))
                    seen[c.label] += w[1:]  # the prefill is no verification forward
                except Exception as err:  # noqa: BLE001
                    skipped[c.label] = _reason(err)
            bar.update(1)
        new = _rows(configs, samples, seen, skipped, examples, float(temp), block, split)
        base = next((r for r in new if r.builder == "generate" and r.status == "ok"), None)
        for r in new:
            if r.greedy_match is False and base is not None:
                r.greedy_diffs = greedy_diffs(target, prompts, r.outputs, base.outputs)
        rows += new
    bar.close()
    return rows


def _rows(configs: Sequence[Config], samples: dict[str, list[Sample]], seen: dict[str, list[int]],
          skipped: dict[str, str], examples: Sequence[T.Example], temp: float, block: int, split: str) -> list[TreeRow]:
    rows = []
    for c in configs:
        extra = dict(split=split, builder=c.builder, budget=c.budget)
        if c.label in skipped:
            rows.append(TreeRow(c.label, temp, status="skipped", reason=skipped[c.label], **extra))
            continue
        row = summarize(c.label, temp, samples[c.label], examples, block)
        w = seen[c.label]
        rows.append(TreeRow(**{f.name: getattr(row, f.name) for f in fields(Row)}, **extra,
                            width=round(sum(w) / len(w), 3) if w else None))
    base = next((r for r in rows if r.builder == "generate" and r.status == "ok"), None)
    for r in rows:
        if base is not None and r.status == "ok":
            r.speedup = round(r.tokens_per_s / base.tokens_per_s, 3) if r.tokens_per_s and base.tokens_per_s else None
            r.greedy_match = r.outputs == base.outputs if temp == 0 else None
    return rows


def greedy_diffs(target, prompts: Sequence[list[int]], outputs: Sequence[list[int]],
                 reference: Sequence[list[int]]) -> list[dict[str, Any]]:
    """Per prompt whose greedy output differs from ``reference`` (``target.generate``'s): the first
    differing position, both tokens, and ``logit_margin`` = the target's logit of the reference's
    token minus ours there, from one fresh forward of prompt + the reference's prefix. A margin near
    0 is a float near-tie that the tree forward's different shape broke the other way (exactly
    computed, tree verification is lossless); a large one would be a real bug."""
    diffs = []
    device = _device(target)
    for i, (prompt, ours, ref) in enumerate(zip(prompts, outputs, reference)):
        if ours == ref:
            continue
        j = next((k for k, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        entry: dict[str, Any] = {"prompt": i, "position": j, "ours": ours[j] if j < len(ours) else None,
                                 "generate": ref[j] if j < len(ref) else None, "logit_margin": None}
        if entry["ours"] is not None and entry["generate"] is not None:
            with torch.inference_mode():
                logits = target(torch.tensor([list(prompt) + ref[:j]], device=device)).logits[0, -1].float()
            entry["logit_margin"] = float(logits[ref[j]] - logits[ours[j]])
        diffs.append(entry)
    return diffs


def format_diffs(rows: Sequence[TreeRow]) -> str:
    """One line per greedy mismatch (empty when every T = 0 row matched ``generate``)."""
    lines = []
    for r in rows:
        for d in r.greedy_diffs:
            m = d["logit_margin"]
            kind = "" if m is None else " (a float near-tie)" if abs(m) < 1e-3 else " (NOT a near-tie)"
            lines.append(f"  greedy mismatch {r.method}: prompt {d['prompt']}, generated position {d['position']}: "
                         f"token {d['ours']} vs generate's {d['generate']}, target logit margin "
                         f"{'?' if m is None else f'{m:.3g}'}{kind}")
    return "\n".join(lines)


def choose_budgets(rows: Sequence[TreeRow]) -> dict[str, TreeRow]:
    """Per tree builder, its greedy row with the most tokens/s (ties: the smaller budget). Only
    held-out rows may choose: ValueError for any other."""
    best: dict[str, TreeRow] = {}
    for r in rows:
        if r.split != "held-out":
            raise ValueError(f"budgets are chosen on the held-out split only, got a {r.split!r} row ({r.method})")
        if r.budget is None or r.temperature != 0 or r.status != "ok" or r.tokens_per_s is None:
            continue
        cur = best.get(r.builder)
        if cur is None or (r.tokens_per_s, -r.budget) > (cur.tokens_per_s, -cur.budget):
            best[r.builder] = r
    return best


@dataclass
class TreeBench:
    """``run_trees``' result: both splits' rows and the chosen budget per builder."""

    held_out: list[TreeRow]
    reported: list[TreeRow]
    chosen: dict[str, TreeRow]  # builder -> its chosen held-out row

    def selection(self) -> dict[str, dict[str, Any]]:
        return {b: {"budget": r.budget, "split": r.split, "temperature": r.temperature, "by": "tokens_per_s",
                    "held_out_tokens_per_s": r.tokens_per_s} for b, r in self.chosen.items()}


def run_trees(
    target,
    drafter,
    builders: Sequence[str],
    budgets: Sequence[int],
    held_out: Sequence[T.Example],
    reported: Sequence[T.Example],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    max_new_tokens: Optional[int] = None,
    block_size: Optional[int] = None,
    progress: bool = True,
) -> TreeBench:
    """Choose each builder's budget on ``held_out`` (greedy, tokens/s), then run every builder x
    budget and the baselines on ``reported`` at every temperature, the chosen budgets marked.
    ``held_out`` and ``reported`` must not share a prompt."""
    check_builders(builders)
    check_budgets(budgets)
    check_temperatures(temperatures)
    overlap = {tuple(T.prompt_words(ex)) for ex in held_out} & {tuple(T.prompt_words(ex)) for ex in reported}
    if overlap:
        raise ValueError(f"the held-out and reported splits share {len(overlap)} prompt(s); they must be disjoint")
    configs = configs_for(builders, budgets)
    kw = dict(seed=seed, max_new_tokens=max_new_tokens, block_size=block_size, progress=progress)
    held = run_split(target, drafter, configs, held_out, split="held-out", temperatures=(0.0,), **kw)
    chosen = choose_budgets(held)
    rep = run_split(target, drafter, configs, reported, split="reported", temperatures=temperatures, **kw)
    for r in held + rep:
        r.chosen = r.builder in chosen and r.budget == chosen[r.builder].budget
    return TreeBench(held, rep, chosen)


# ---- the cost of one target forward ---------------------------------------------------------------
@dataclass
class CostCurve:
    """Median wall time (ms) of one batch-1 target forward of 1 + N tokens over a warm cache of
    ``prefix`` tokens, per N; the least-squares line ``ms = a + b * N``."""

    prefix: int
    repeats: int
    sizes: list[int]
    ms: list[float]
    a_ms: float
    b_ms: float
    b_over_a: float
    device: str = ""
    samples_ms: list[list[float]] = field(default_factory=list)  # every timed call per N

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"target forward cost (batch 1, cache of {self.prefix} tokens, median of {self.repeats}, "
                 f"{self.device}): fit t(N) = {self.a_ms:.4f} ms + {self.b_ms:.5f} ms * N, "
                 f"b/a = {self.b_over_a:.5f} per node",
                 "| N | T = 1 + N | ms | fit ms |", "|---|---|---|---|"]
        lines += [f"| {n} | {n + 1} | {m:.4f} | {self.a_ms + self.b_ms * n:.4f} |" for n, m in zip(self.sizes, self.ms)]
        return "\n".join(lines)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x; ValueError with fewer than two distinct x."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"a line needs at least two distinct x values, got {list(xs)}")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def forward_cost(target, sizes: Sequence[int] = COST_SIZES, *, prefix: int = 100, repeats: int = 15, warmup: int = 2,
                 taps: Sequence[int] = (), seed: int = 0) -> CostCurve:
    """Time one target forward of T = 1 + N tokens (N in ``sizes``) at batch 1, under
    ``torch.inference_mode``, appended to a DynamicCache that holds ``prefix`` random tokens; the
    cache is cropped back after every call (outside the timing). The forward is the loop's
    (``Target.forward``, a 4-D boolean mask as tree verification passes, ``taps``: the drafter's
    tapped layers). Median of ``repeats`` calls per size after ``warmup`` untimed rounds; the sizes
    take turns within each round."""
    from dllm.drafters.target import Target, crop_to

    bad = [n for n in sizes if isinstance(n, bool) or not isinstance(n, int) or n < 0]
    if bad or len(set(sizes)) < 2:
        raise ValueError(f"cost sizes must be at least two distinct integers >= 0, got {list(sizes)!r}")
    for name, value in (("prefix", prefix), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    tgt = Target(target, taps=tuple(taps))
    device, vocab = tgt.device, tgt.info.vocab_size
    gen = torch.Generator().manual_seed(seed)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with torch.inference_mode():
        cache = tgt.new_cache(1)
        ids = torch.randint(0, vocab, (1, prefix), generator=gen).to(device)
        tgt.forward(ids, torch.ones_like(ids, dtype=torch.bool), torch.arange(prefix, device=device)[None], cache,
                    last_only=True)
        inputs = {}
        for n in sizes:
            t = n + 1
            inner = torch.ones((t, t), dtype=torch.bool, device=device).tril()
            mask = torch.cat([torch.ones((t, prefix), dtype=torch.bool, device=device), inner], dim=1)[None, None]
            inputs[n] = (torch.randint(0, vocab, (1, t), generator=gen).to(device), mask,
                         prefix + torch.arange(t, device=device)[None])
        for rep in range(warmup + repeats):  # sizes interleaved: a slow spell of the machine hits them alike
            for n in sizes:
                sync(device)
                t0 = time.perf_counter()
                tgt.forward(*inputs[n], cache)
                sync(device)
                if rep >= warmup:
                    times[n].append(time.perf_counter() - t0)
                crop_to(cache, prefix)
    ms = [round(statistics.median(times[n]) * 1e3, 5) for n in sizes]
    samples = [[round(x * 1e3, 5) for x in times[n]] for n in sizes]
    a, b = fit_line([float(n) for n in sizes], ms)
    return CostCurve(prefix=prefix, repeats=repeats, sizes=list(sizes), ms=ms, a_ms=round(a, 5), b_ms=round(b, 6),
                     b_over_a=round(b / a, 6) if a > 0 else float("nan"), device=str(device), samples_ms=samples)


# ---- tables, plot --------------------------------------------------------------------------------
def format_selection(bench: TreeBench, temperatures: Sequence[float]) -> str:
    """Per builder: the chosen budget and what the reported split says about every budget."""
    lines = ["| builder | chosen budget (held-out) | held-out tokens/s | " +
             " | ".join(f"reported T={t:g}: chosen tokens/s, best budget" for t in temperatures) + " |",
             "|" + "|".join("---" for _ in range(3 + len(temperatures))) + "|"]
    for b, row in bench.chosen.items():
        cells = []
        for t in temperatures:
            mine = [r for r in bench.reported if r.builder == b and r.temperature == t and r.status == "ok"]
            best = max(mine, key=lambda r: (r.tokens_per_s or 0, -(r.budget or 0)), default=None)
            pick = next((r for r in mine if r.chosen), None)
            cells.append(f"{pick.tokens_per_s if pick else ''}, {best.budget if best else ''}")
        lines.append(f"| {b} | {row.budget} | {row.tokens_per_s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_trees(rows: Sequence[TreeRow], path: Path, title: str, temperature: float = 0.0) -> None:
    """Two panels over budget (log2 x) per builder, reported rows at ``temperature``: tau (the no-tree
    chain's as a line) and tokens/s (no-tree and generate as lines); chosen budgets starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.split == "reported" and r.temperature == temperature and r.status == "ok"]
    builders = list(dict.fromkeys(r.builder for r in rows if r.budget is not None))
    lines = {r.builder: r for r in rows if r.budget is None}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, label in ((axes[0], "tau", "tau (tokens / target forward)"), (axes[1], "tokens_per_s", "tokens/s")):
        for i, b in enumerate(builders):
            mine = sorted((r for r in rows if r.builder == b), key=lambda r: r.budget)
            color = f"C{i}"
            ax.plot([r.budget for r in mine], [getattr(r, key) for r in mine], "o-", color=color, label=b)
            ax.scatter([r.budget for r in mine if r.chosen], [getattr(r, key) for r in mine if r.chosen], marker="*",
                       s=220, color=color, edgecolor="black", zorder=3)
        for name, style in (("no-tree", "--"), ("generate", ":")):
            if name in lines and (key == "tokens_per_s" or name == "no-tree"):
                ax.axhline(getattr(lines[name], key), linestyle=style, color="gray",
                           label=f"{'chain, no tree' if name == 'no-tree' else 'target.generate'}")
        ax.set_xscale("log", base=2)
        ticks = sorted({r.budget for r in rows if r.budget is not None})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("tree budget (draft nodes)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("tau vs budget (* = chosen on held-out)", fontsize=10)
    axes[1].set_title("tokens/s vs budget", fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- command line --------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The flags of ``dllm bench spec --trees``; ValueError (naming the valid values) for bad ones."""
    ap = argparse.ArgumentParser(prog="dllm bench spec --trees", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", nargs="+", default=[",".join(DEFAULT_BUILDERS)],
                    help="tree builders, comma/space separated (dllm.drafters.tree)")
    ap.add_argument("--budgets", nargs="+", default=[",".join(map(str, DEFAULT_BUDGETS))],
                    help="draft nodes per tree, comma/space separated")
    ap.add_argument("--target", default="tiny-ar", help="transformers causal LM (embedded name, directory, Hub id)")
    ap.add_argument("--dflash", default="tiny-ar-dflash", help="DFlash drafter checkpoint of the target")
    ap.add_argument("--tasks", nargs="+", default=None, help="task names (default: the long-answer suite)")
    ap.add_argument("--n", type=int, default=4, help="test examples per task size in each split")
    ap.add_argument("--block-size", type=int, default=None, help="B (K = B - 1 drafted positions); default the "
                                                                     "drafter's")
    ap.add_argument("--temperatures", nargs="+", default=["0,1"], help="comma/space separated, >= 0 (reported split)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: each example's answer length")
    ap.add_argument("--seed", type=int, default=0, help="prompt i is seeded with seed + i")
    ap.add_argument("--prefix", type=int, default=100, help="cached tokens before the timed forwards (cost curve)")
    ap.add_argument("--cost-repeats", type=int, default=15, help="timed forwards per size (cost curve; median)")
    ap.add_argument("--device", default=None, help="where the target loads (default CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a busy machine)")
    ap.add_argument("--out", default=None, help="write everything as JSON here")
    ap.add_argument("--png", default=None, help="write the tau / tokens/s vs budget plot here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    args.trees = _split(args.trees)
    check_builders(args.trees)
    try:
        args.budgets = [int(b) for b in _split(args.budgets)]
    except ValueError:
        raise ValueError(f"--budgets must be integers >= 1 such as 16,32,64,128, got {args.budgets!r}") from None
    check_budgets(args.budgets)
    try:
        args.temperatures = [float(t) for t in _split(args.temperatures)]
    except ValueError:
        raise ValueError(f"--temperatures must be numbers >= 0 such as 0,1, got {args.temperatures!r}") from None
    check_temperatures(args.temperatures)
    args.tasks = _split(args.tasks) or list(T.suite_task_names("long-answer"))
    known = [e.name for e in T.tasks]
    bad = [t for t in args.tasks if t not in known]
    if bad:
        raise ValueError(f"unknown task(s) {bad}; valid tasks: {', '.join(known)}")
    for flag in ("n", "block_size", "threads", "max_new_tokens", "prefix", "cost_repeats"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be an integer >= 1, got {value}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``dllm bench spec --trees ... [flags]``: print the tables, write ``--out`` JSON and ``--png``."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from dllm.drafters.base import make_drafter
    from dllm.drafters.loading import load_target

    target, _ = load_target(args.target, device=args.device)
    drafter = make_drafter("dflash", model=args.dflash)
    block = args.block_size or drafter.block_size
    held, reported = held_out_examples(args.tasks, args.n), reported_examples(args.tasks, args.n)
    curve = forward_cost(target, prefix=args.prefix, repeats=args.cost_repeats, taps=drafter.target_layers)
    bench = run_trees(target, drafter, args.trees, args.budgets, held, reported, temperatures=args.temperatures,
                      seed=args.seed, max_new_tokens=args.max_new_tokens, block_size=block,
                      progress=not args.no_progress)
    print(f"target {args.target}, drafter {args.dflash}: block size {block} (K = {block - 1}), batch 1, "
          f"{torch.get_num_threads()} threads, {_device(target)}; tasks {', '.join(args.tasks)}; "
          f"reported = test instances 0..{args.n - 1} per size ({len(reported)} prompts), "
          f"held-out = {args.n}..{2 * args.n - 1} per size ({len(held)} prompts)")
    print()
    print(curve.format())
    print("\nheld-out split (chooses each builder's budget by tokens/s, T = 0):")
    print(format_table(bench.held_out, COLUMNS))
    print("\nreported split:")
    print(format_table(bench.reported, COLUMNS))
    diffs = format_diffs(bench.held_out + bench.reported)
    if diffs:
        print("\ngreedy mismatches with target.generate (first differing token per prompt):")
        print(diffs)
    print("\nbudget selection (chosen on held-out; 'best budget' = the reported split's own best, for comparison):")
    print(format_selection(bench, args.temperatures))
    payload = {"target": args.target, "dflash": args.dflash, "tasks": args.tasks, "n_per_size": args.n,
               "splits": {"held-out": {"instances": f"{args.n}..{2 * args.n - 1} per size", "prompts": len(held),
                                       "temperatures": [0.0], "role": "chooses each builder's budget"},
                          "reported": {"instances": f"0..{args.n - 1} per size", "prompts": len(reported),
                                       "temperatures": args.temperatures, "role": "reported"}},
               "builders": args.trees, "budgets": args.budgets, "block_size": block, "temperatures": args.temperatures,
               "seed": args.seed, "threads": torch.get_num_threads(), "device": str(_device(target)),
               "selection": bench.selection(), "cost_curve": curve.to_json(),
               "rows": [r.to_json() for r in bench.held_out + bench.reported]}
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {out}")
    if args.png:
        png = Path(args.png)
        png.parent.mkdir(parents=True, exist_ok=True)
        temp = 0.0 if 0.0 in args.temperatures else min(args.temperatures)
        title = (f"target {args.target}, DFlash drafter {args.dflash}: {len(reported)} reported prompts, "
                 f"T = {temp:g}, batch 1")
        try:
            plot_trees(bench.reported, png, title, temperature=temp)
            print(f"wrote {png}")
        except ImportError:
            print("no plot: install matplotlib for --png (pip install matplotlib)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["BASELINES", "COLUMNS", "COST_SIZES", "Config", "CostCurve", "DEFAULT_BUDGETS", "DEFAULT_BUILDERS",
           "TreeBench", "TreeRow", "check_budgets", "check_builders", "choose_budgets", "configs_for", "fit_line",
           "format_diffs", "format_selection", "forward_cost", "greedy_diffs", "held_out_examples", "main",
           "parse_args", "plot_trees", "reported_examples", "run_split", "run_trees", "tree_runner", "widths"]

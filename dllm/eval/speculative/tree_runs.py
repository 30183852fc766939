"""One split of ``dllm bench trees``: the decoding configurations (``Config``: a tree builder at
a budget, or a baseline), their runners, ``run_split`` (a ``TreeRow`` per temperature and
configuration) and ``greedy_diffs`` (where a greedy output parts from ``target.generate``'s)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Optional, Sequence

import torch

from dllm import tasks as T
from dllm.eval.speculative.flags import check_temperatures, failure_reason
from dllm.eval.speculative.report import Row, compare_to_baseline, summarize, task_vocab
from dllm.eval.speculative.runners import Runner, Sample, device_of, hf_runner, loop_runner, timed_call

BASELINES: tuple[str, ...] = ("generate", "no-tree")  # target.generate; the DFlash chain without a tree
SPLITS: tuple[str, ...] = ("held-out", "reported")
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Config:
    """One decoding configuration: ``builder`` a tree builder name (with ``budget``), or a baseline
    (``generate``: target.generate; ``no-tree``: the DFlash chain, a plan without a tree)."""

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
    """A ``report.Row`` (``method`` = the configuration's label) of one split."""

    split: str = ""
    builder: str = ""
    budget: Optional[int] = None
    width: Optional[float] = None  # mean tokens per verification forward (the prefill not counted)
    chosen: bool = False
    prompt_forwards: list[int] = field(default_factory=list)  # target forwards per prompt (``trees_report.paired``)
    prompt_tokens: list[int] = field(default_factory=list)  # generated tokens per prompt
    greedy_diffs: list[dict[str, Any]] = field(default_factory=list)  # T = 0 only: see ``greedy_diffs``


# ---- runners -------------------------------------------------------------------------------------
def tree_runner(target, drafter, block_size: int, tree: str) -> Runner:
    """``speculative_generate(..., plan=Plan(block_size, tree))`` at batch 1 (``runners.loop_runner``
    with a tree)."""
    from dllm.drafters.loop import speculative_generate
    from dllm.drafters.plan import Plan
    from dllm.drafters.trees import make_tree_builder
    from dllm.models.text.task_tokenizer import task_tokenizer

    make_tree_builder(tree)  # a bad spec fails here, not inside the first timed call
    device = device_of(target)
    tokenizer = task_tokenizer()

    def run(prompt: list[int], temperature: float, max_new: int, seed: int) -> Sample:
        out, wall = timed_call(device, lambda: speculative_generate(
            target, drafter, [prompt], max_new_tokens=max_new, temperature=temperature, top_p=1.0, top_k=0,
            plan=Plan(block_size=block_size, tree=tree), seed=seed, tokenizer=tokenizer))
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
    """Records the input width (tokens) of every forward of the causal LM ``module``, read at its input
    embedding (``get_input_embeddings()``, called once per forward by transformers' forward and by the
    speculative fast path's static forward alike)."""
    seen: list[int] = []

    def hook(m, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            seen.append(int(ids.shape[-1]))

    embed = module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else module
    handle = embed.register_forward_pre_hook(hook, with_kwargs=True)
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
    vocab = task_vocab()
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
            skipped[c.label] = failure_reason(err)
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
                    skipped[c.label] = failure_reason(err)
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
                            width=round(sum(w) / len(w), 3) if w else None,
                            prompt_forwards=[s.target_forwards for s in samples[c.label]],
                            prompt_tokens=[len(s.generated) for s in samples[c.label]]))
    compare_to_baseline(rows, next((r for r in rows if r.builder == "generate" and r.status == "ok"), None), temp)
    return rows


def greedy_diffs(target, prompts: Sequence[list[int]], outputs: Sequence[list[int]],
                 reference: Sequence[list[int]]) -> list[dict[str, Any]]:
    """Per prompt whose greedy output differs from ``reference`` (``target.generate``'s): the first
    differing position, both tokens, and ``logit_margin`` = the target's logit of the reference's
    token minus ours there, from one fresh forward of prompt + the reference's prefix. A margin near
    0 is a float near-tie that the tree forward's different shape broke the other way (exactly
    computed, tree verification is lossless); a large one would be a real bug."""
    diffs = []
    device = device_of(target)
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



@dataclass
class TreeBench:
    """``run_trees``' result: both splits' rows and the chosen budget per builder."""

    held_out: list[TreeRow]
    reported: list[TreeRow]
    chosen: dict[str, TreeRow]  # builder -> its chosen held-out row

    def selection(self) -> dict[str, dict[str, Any]]:
        return {b: {"budget": r.budget, "split": r.split, "temperature": r.temperature, "by": "tokens_per_s",
                    "held_out_tokens_per_s": r.tokens_per_s} for b, r in self.chosen.items()}


__all__ = ["BASELINES", "SPLITS", "Config", "TreeBench", "TreeRow", "configs_for", "greedy_diffs", "make_runner",
           "run_split", "tree_runner", "widths"]

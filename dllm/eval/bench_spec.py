"""``dllm bench spec``: speculative decoding methods side by side, at batch 1, on the same prompts.

Each prompt of the tasks (default: the long-answer suite) is decoded one at a time (as DFlash's
reference and transformers' assisted generation do) by every method in turn, so a busy machine slows
them alike. ``METHODS``: ``generate`` (plain ``target.generate``, the baseline), ``ar`` (our loop,
block size 1), ``dflash`` / ``ngram`` / ``dlm`` (our loop with that drafter, block size B),
``assisted`` (transformers' ``assistant_model=``: up to 20 drafts, fewer once the assistant's
confidence drops below 0.4) and ``prompt_lookup`` (transformers' ``prompt_lookup_num_tokens=10``).

A ``Row`` per method and temperature: ``tau`` = generated tokens / target forwards (prefill and bonus
included; 1.0 without drafts); ``tau_round`` = mean tokens per verification round (DFlash's
convention: our prefill is no round, transformers' first forward is one, it verifies drafts);
``acceptance`` (k-1: fraction of rounds accepting >= k drafts); target / drafter forwards
(transformers' counted by forward pre-hooks); tokens/s; wall time; ``speedup`` (tokens/s over
``generate``'s); exact-match ``accuracy``; at T = 0 ``greedy_match`` (outputs token-identical to
``generate``'s; every method is lossless). A method that cannot run is skipped, with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch

from dllm import tasks as T
from dllm.eval.timing import sync

METHODS: tuple[str, ...] = ("generate", "ar", "dflash", "assisted", "prompt_lookup", "ngram", "dlm")
MODEL_FLAGS = {"dflash": "--dflash", "assisted": "--assistant", "dlm": "--dlm"}  # methods that need a model
PROMPT_LOOKUP_TOKENS = 10
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Method:
    """One method; ``model`` (name, path or loaded model) for dflash / assisted / dlm; ``options``:
    drafter options (dlm: sampler, steps)."""

    name: str
    model: Any = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sample:
    """One prompt through one method."""

    generated: list[int]
    target_forwards: int
    drafter_forwards: int
    commits: Optional[list[int]]  # tokens committed per verification round (None: unknown)
    wall_s: float


@dataclass
class Row:
    """One method at one temperature, over every prompt."""

    method: str
    temperature: float
    status: str = "ok"  # "ok" | "skipped"
    reason: str = ""
    prompts: int = 0
    generated_tokens: int = 0
    target_forwards: int = 0
    drafter_forwards: int = 0
    tau: Optional[float] = None
    tau_round: Optional[float] = None
    acceptance: Optional[list[float]] = None
    tokens_per_s: Optional[float] = None
    wall_s: float = 0.0
    speedup: Optional[float] = None
    accuracy: Optional[float] = None
    greedy_match: Optional[bool] = None
    outputs: list[list[int]] = field(default_factory=list, repr=False)  # generated ids per prompt (not in JSON)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "outputs"}


Runner = Callable[[list[int], float, int, int], Sample]  # (prompt ids, temperature, max new tokens, seed)


def check_methods(names: Sequence[str]) -> None:
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise ValueError(f"unknown method(s) {bad or list(names)!r}; valid methods: {', '.join(METHODS)}")


def check_temperatures(temps: Sequence[float]) -> None:
    bad = [t for t in temps if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf")]
    if bad or not temps:
        raise ValueError(f"temperatures must be finite numbers >= 0 (0 = greedy), got {list(temps)!r}")


@contextmanager
def counting(module: Optional[torch.nn.Module]) -> Iterator[list[Any]]:
    """Records, per forward call of ``module``, where its input starts (a 1-element tensor, an int, or
    None when unreadable); no host sync in the hook. ``module`` None: records nothing."""
    starts: list[Any] = []
    hook = lambda m, a, kw: starts.append(_start(kw))  # noqa: E731
    handle = None if module is None else module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield starts
    finally:
        if handle is not None:
            handle.remove()


def _start(kwargs: dict) -> Any:
    for key in ("position_ids", "cache_position"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.numel():
            return value.reshape(-1)[:1].clone()
    cache = kwargs.get("past_key_values", kwargs.get("cache"))  # transformers >= 5 passes `cache`
    return int(cache.get_seq_length()) if hasattr(cache, "get_seq_length") else None


def commits_from_starts(starts: Sequence[Any], prompt_len: int, generated: int) -> Optional[list[int]]:
    """Tokens committed per forward: forward i + 1 starts at the last token forward i committed (its
    anchor; the prefill's anchor is the last prompt token). None when a start was not readable."""
    anchors = [prompt_len - 1, *(int(s) if s is not None else None for s in starts[1:])]
    if not starts or any(a is None for a in anchors):
        return None
    out = [b - a for a, b in zip(anchors, [*anchors[1:], prompt_len + generated - 1])]
    return out if all(n >= 1 for n in out) else None


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _timed(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def hf_runner(target, *, assistant=None, **extra: Any) -> Runner:
    """``target.generate`` at batch 1 (``extra``: e.g. prompt_lookup_num_tokens)."""
    device, eos = _device(target), _eos_ids(target)
    if assistant is not None:
        extra["assistant_model"] = assistant

    def run(prompt: list[int], temperature: float, max_new: int, seed: int) -> Sample:
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
            dict(do_sample=False)
        with counting(target) as starts, counting(assistant) as drafts, torch.inference_mode():
            torch.manual_seed(seed)
            out, wall = _timed(device, lambda: target.generate(ids, attention_mask=torch.ones_like(ids),
                                                               max_new_tokens=max_new, **sampling, **extra))
        gen = out[0, len(prompt):].tolist()
        gen = next((gen[:i + 1] for i, t in enumerate(gen) if t in eos), gen)  # nothing after the first EOS
        return Sample(gen, len(starts), len(drafts), commits_from_starts(starts, len(prompt), len(gen)), wall)

    return run


def loop_runner(target, drafter, block_size: int) -> Runner:
    """``speculative_generate`` at batch 1 with a built drafter."""
    from dllm.drafters.loop import speculative_generate

    from dllm.models.task_tokenizer import task_tokenizer

    device = _device(target)
    tokenizer = task_tokenizer()  # the prompts are task prompts; a drafter checks its vocabulary against it

    def run(prompt: list[int], temperature: float, max_new: int, seed: int) -> Sample:
        out, wall = _timed(device, lambda: speculative_generate(
            target, drafter, [prompt], max_new_tokens=max_new, temperature=temperature, top_p=1.0, top_k=0,
            block_size=block_size, seed=seed, tokenizer=tokenizer))
        return Sample(out.generated[0], out.target_forwards, out.drafter_forwards, out.acceptance[0], wall)

    return run


def make_runner(target, method: Method, block_size: int) -> Runner:
    """The runner of one method; loads its model (errors propagate: ``run_bench`` skips the method)."""
    from dllm.drafters.base import make_drafter

    name, model = method.name, method.model
    if name in MODEL_FLAGS and model is None:
        raise ValueError(f"method {name!r} needs a model ({MODEL_FLAGS[name]} NAME_OR_PATH)")
    if name in ("generate", "prompt_lookup"):
        return hf_runner(target, **({} if name == "generate" else {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}))
    if name == "assisted":
        if isinstance(model, (str, Path)):
            from dllm.drafters.loading import load_target

            model = load_target(model, device=_device(target))[0]
        return hf_runner(target, assistant=model)
    if name == "ar":
        return loop_runner(target, make_drafter("ngram"), 1)  # block size 1: the drafter is never asked
    drafter = make_drafter(name, **({"model": model} if model is not None else {}), **method.options)
    return loop_runner(target, drafter, block_size)


def _eos_ids(target) -> set[int]:
    eos = getattr(target.generation_config, "eos_token_id", None)
    eos = getattr(target.config, "eos_token_id", None) if eos is None else eos
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def run_bench(
    target,
    methods: Sequence[Union[str, Method]],
    examples: Sequence[T.Example],
    *,
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    max_new_tokens: Optional[int] = None,
    progress: bool = True,
    block_size: int = 16,
    warmup: bool = True,
) -> list[Row]:
    """Decode every example with every method at every temperature: one ``Row`` per (T, method), in
    that order. ``max_new_tokens``: default each example's answer length (answer words + EOS). Prompt
    i is seeded with ``seed + i`` (torch.manual_seed before a transformers call, ``seed=`` for ours).
    ``warmup``: one untimed short greedy call per method first (where most failures surface)."""
    from tqdm.auto import tqdm

    methods = [m if isinstance(m, Method) else Method(m) for m in methods]
    check_methods([m.name for m in methods])
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"each method may appear once, got {[m.name for m in methods]}")
    check_temperatures(temperatures)
    if not examples:
        raise ValueError("run_bench needs at least one example")
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be an integer >= 1 or None, got {max_new_tokens!r}")
    vocab = _task_vocab()
    prompts = [[vocab[w] for w in T.prompt_words(ex)] for ex in examples]
    budgets = [max_new_tokens or T.answer_length(ex.task, ex.size) for ex in examples]
    runners, skipped = _prepare(target, methods, prompts[0], block_size, warmup)
    rows: list[Row] = []
    bar = tqdm(total=len(temperatures) * len(examples), disable=not progress, desc="bench spec", unit="prompt")
    for temp in temperatures:
        samples: dict[str, list[Sample]] = {name: [] for name in runners}
        for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
            for name in [n for n in runners if n not in skipped]:
                bar.set_postfix_str(f"T={temp:g} {name}")
                try:
                    samples[name].append(runners[name](prompt, float(temp), budget, seed + i))
                except Exception as err:  # noqa: BLE001  one method's failure never ends the run
                    skipped[name] = _reason(err)
            bar.update(1)
        rows += _rows(methods, samples, skipped, examples, float(temp), block_size)
    bar.close()
    return rows


def _prepare(target, methods: Sequence[Method], prompt: list[int], block_size: int,
             warmup: bool) -> tuple[dict[str, Runner], dict[str, str]]:
    """Every method's runner, or its reason to be skipped."""
    runners: dict[str, Runner] = {}
    skipped: dict[str, str] = {}
    for m in methods:
        try:
            runners[m.name] = make_runner(target, m, block_size)
            if warmup:
                runners[m.name](prompt, 0.0, WARMUP_TOKENS, 0)
        except Exception as err:  # noqa: BLE001
            skipped[m.name] = _reason(err)
    return runners, skipped


def _reason(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _rows(methods: Sequence[Method], samples: dict[str, list[Sample]], skipped: dict[str, str],
          examples: Sequence[T.Example], temp: float, block_size: int) -> list[Row]:
    rows = [Row(m.name, temp, status="skipped", reason=skipped[m.name]) if m.name in skipped
            else summarize(m.name, temp, samples[m.name], examples, block_size) for m in methods]
    base = next((r for r in rows if r.method == "generate" and r.status == "ok"), None)
    for r in rows:
        if base is not None and r.status == "ok":
            r.speedup = round(r.tokens_per_s / base.tokens_per_s, 3) if r.tokens_per_s and base.tokens_per_s else None
            r.greedy_match = r.outputs == base.outputs if temp == 0 else None
    return rows


def summarize(method: str, temp: float, samples: Sequence[Sample], examples: Sequence[T.Example],
              block_size: int) -> Row:
    """One row from one method's samples at one temperature (sample i is examples[i])."""
    words = {i: w for w, i in _task_vocab().items()}
    tokens = sum(len(s.generated) for s in samples)
    forwards = sum(s.target_forwards for s in samples)
    wall = sum(s.wall_s for s in samples)
    commits = None if any(s.commits is None for s in samples) else [n for s in samples for n in s.commits]
    hits = [T.score(ex, [words.get(t, "?") for t in s.generated]) for ex, s in zip(examples, samples)]
    return Row(
        method=method, temperature=temp, prompts=len(samples), generated_tokens=tokens, target_forwards=forwards,
        drafter_forwards=sum(s.drafter_forwards for s in samples),
        tau=round(tokens / forwards, 4) if forwards else None,
        tau_round=round(sum(commits) / len(commits), 4) if commits else None,
        acceptance=None if commits is None else acceptance_by_position(commits, block_size),
        tokens_per_s=round(tokens / wall, 2) if wall > 0 else None, wall_s=round(wall, 4),
        accuracy=round(sum(hits) / len(hits), 4) if hits else None, outputs=[list(s.generated) for s in samples],
    )


def acceptance_by_position(commits: Sequence[int], block_size: int) -> list[float]:
    """Entry k - 1 (k = 1..block_size - 1): the fraction of rounds that accepted >= k drafts."""
    n = max(len(commits), 1)
    return [round(sum(c > k for c in commits) / n, 4) for k in range(1, block_size)]


@lru_cache(maxsize=1)
def _task_vocab() -> dict[str, int]:
    from dllm.models.task_tokenizer import task_tokenizer

    return task_tokenizer().get_vocab()


COLUMNS = ("method", "temperature", "tau", "tau_round", "target_forwards", "drafter_forwards", "tokens_per_s",
           "wall_s", "speedup", "accuracy", "greedy_match", "status")


def format_table(rows: Sequence[Row], columns: Sequence[str] = COLUMNS) -> str:
    """Markdown table of the rows, then each row's acceptance by position (k = 1..B-1)."""
    def cell(r: Row, c: str) -> str:
        v = getattr(r, c)
        return f"skipped ({r.reason})" if c == "status" and r.status == "skipped" else "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows]
    lines.append("\nacceptance by position (fraction of rounds accepting >= k drafts, k = 1..B-1):")
    lines += [f"  {r.method:<14} T={r.temperature:g}  " + " ".join(f"{a:.2f}" for a in r.acceptance)
              for r in rows if r.acceptance]
    return "\n".join(lines)


def _split(values: Optional[Sequence[str]]) -> list[str]:
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The flags of ``dllm bench spec``; ValueError (naming the valid values) for bad ones."""
    ap = argparse.ArgumentParser(prog="dllm bench spec", description=__doc__.split("\n\n")[0],
                                 epilog="dllm bench spec --trees chain,ddtree,taps --budgets 16,32,64,128 ...: draft "
                                        "trees vs their budget (dllm/eval/bench_trees.py; --trees x --help: its flags)")
    ap.add_argument("--target", default="tiny-ar", help="transformers causal LM (embedded name, directory, Hub id)")
    ap.add_argument("--dflash", default="tiny-ar-dflash", help="DFlash drafter checkpoint of the target")
    ap.add_argument("--assistant", default="tiny-ar-draft", help="small AR model for assisted generation")
    ap.add_argument("--dlm", default="tiny-llada", help="dllm diffusion model drafting for the dlm method")
    ap.add_argument("--dlm-sampler", default="low_confidence")
    ap.add_argument("--dlm-steps", type=int, default=4, help="denoising forwards per dlm draft")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), help=f"comma/space separated: {','.join(METHODS)}")
    ap.add_argument("--tasks", nargs="+", default=None, help="task names (default: the long-answer suite)")
    ap.add_argument("--n", type=int, default=4, help="test examples per task size")
    ap.add_argument("--block-size", type=int, default=16, help="B for dflash / ngram / dlm (K = B - 1 drafts)")
    ap.add_argument("--temperatures", nargs="+", default=["0,1"], help="comma/space separated, >= 0")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: each example's answer length")
    ap.add_argument("--seed", type=int, default=0, help="prompt i is seeded with seed + i")
    ap.add_argument("--device", default=None, help="where the target loads (default CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a busy machine)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    args.methods = _split(args.methods)
    check_methods(args.methods)
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
    for flag in ("n", "block_size", "dlm_steps", "threads", "max_new_tokens"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be an integer >= 1, got {value}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``dllm bench spec [flags]``: print the table, write ``--out`` JSON. ValueError on bad flags.
    With ``--trees``: the draft-tree budget benchmark (``dllm.eval.bench_trees``, its own flags)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--trees" or a.startswith("--trees=") for a in argv):
        from dllm.eval import bench_trees

        return bench_trees.main(argv)
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from dllm.drafters.loading import load_target

    target, _ = load_target(args.target, device=args.device)
    models = {"dflash": args.dflash, "assisted": args.assistant, "dlm": args.dlm}
    opts = {"dlm": {"sampler": args.dlm_sampler, "steps": args.dlm_steps}}
    names = args.methods if "generate" in args.methods else ["generate", *args.methods]  # the baseline always runs
    methods = [Method(n, models.get(n), opts.get(n, {})) for n in names]
    examples = [ex for t in args.tasks for ex in T.test_split(t, None, n=args.n)]
    rows = run_bench(target, methods, examples, temperatures=args.temperatures, seed=args.seed,
                     max_new_tokens=args.max_new_tokens, progress=not args.no_progress, block_size=args.block_size)
    print(f"target {args.target}: {len(examples)} prompts ({', '.join(args.tasks)}; n = {args.n} per size), "
          f"batch 1, block size {args.block_size}, {torch.get_num_threads()} threads, {_device(target)}")
    print(format_table(rows))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"target": args.target, "models": models, "tasks": args.tasks, "n_per_size": args.n,
                   "prompts": len(examples), "block_size": args.block_size, "temperatures": args.temperatures,
                   "seed": args.seed, "threads": torch.get_num_threads(), "device": str(_device(target)),
                   "rows": [r.to_json() for r in rows]}
        out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["COLUMNS", "METHODS", "Method", "Row", "Sample", "acceptance_by_position", "commits_from_starts",
           "counting", "format_table", "hf_runner", "loop_runner", "main", "make_runner", "parse_args", "run_bench",
           "summarize"]

"""Weight-only quantization of the embedded models: bytes, accuracy against float32, speed.

    python benchmarks/quantize.py [--per-size 4] [--threads 1] [--methods int8,int4,nf4]
                                  [--out benchmarks/results/quantize.md]

For every method of ``dllm.models.quantize`` (and float32):

1. weight bytes (``weight_bytes``: int data plus scales, as stored) of every embedded model family:
   tiny-llada, tiny-dream (``dllm.load``), tiny-ar, tiny-ar-draft (``load_target``), tiny-ar-dflash
   (``load_dflash``);
2. the diffusion models on the PB-mini suite (test instances 0 .. per_size-1 of every size of every
   task; ``low_confidence`` one token per step, greedy): exact-match accuracy, the examples whose
   score differs from float32's, tokens per second;
3. the AR target tiny-ar on its tasks (the long-answer suite + short copy/reverse, the same
   instances), greedy ``generate``: accuracy, outputs token-equal to float32's, tokens per second;
4. speculative decoding (tiny-ar float32 target, tiny-ar-dflash drafter quantized, block 16,
   greedy): outputs equal to the target's own greedy (lossless whatever the drafter), generated
   tokens per target forward.

CPU timings on a shared machine are indicative only; the table says which torch / torchao /
bitsandbytes produced it.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from dllm import tasks as T
from dllm.models import load
from dllm.models.quantize import QUANTIZATIONS, import_library, weight_bytes
from dllm.scoring.exact_match import decode_and_score, eval_examples

DIFFUSION = ("tiny-llada", "tiny-dream")
AR_TASKS = tuple(T.suite_task_names(T.SUITES[1])) + ("copy", "reverse", "copy_2tok", "reverse_2tok")


def versions() -> str:
    out = [f"torch {torch.__version__}"]
    for lib in ("torchao", "bitsandbytes"):
        try:
            out.append(f"{lib} {import_library(QUANTIZATIONS['int8' if lib == 'torchao' else 'nf4']).__version__}")
        except ValueError:
            out.append(f"{lib} (not installed)")
    return ", ".join(out)


def load_any(name: str, method: Optional[str]) -> torch.nn.Module:
    if name.startswith("tiny-ar-dflash"):
        from dllm.drafters.dflash.dflash2.io import load_any_dflash

        return load_any_dflash(name, quantization=method)
    if name.startswith("tiny-ar"):
        from dllm.models.targets import load_target

        return load_target(name, quantization=method)[0]
    return load(name, quantization=method)


def diffusion_run(model, examples: Sequence[T.Example]) -> dict[str, Any]:
    tally = decode_and_score(model, examples, "low_confidence", tokens_per_step=1)
    solved = [tally.solved[i] for i in range(len(examples))]
    return {"acc": sum(solved) / len(solved), "solved": solved,
            "tok_s": tally.generated_tokens / max(tally.seconds, 1e-9), "seconds": tally.seconds}


def ar_greedy(target, examples: Sequence[T.Example]) -> tuple[list[list[int]], float]:
    """Greedy answers of a transformers causal LM, one batch per (task, size) (equal prompt lengths):
    the generated ids up to and including the first EOS, and the wall time."""
    eos = T.word_id(T.EOS)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, ex in enumerate(examples):
        groups.setdefault((ex.task, ex.size), []).append(i)
    out: list[list[int]] = [[] for _ in examples]
    seconds = 0.0
    for (task, size), rows in groups.items():
        ids = torch.tensor([T.prompt_ids(examples[i]) for i in rows])
        t0 = time.perf_counter()
        with torch.inference_mode():
            gen = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=T.answer_length(task, size) + 1, eos_token_id=eos,
                                  pad_token_id=T.word_id(T.PAD))
        seconds += time.perf_counter() - t0
        for r, i in enumerate(rows):
            g = gen[r, ids.shape[1]:].tolist()
            out[i] = g[:g.index(eos) + 1] if eos in g else g
    return out, seconds


def ar_score(examples: Sequence[T.Example], answers: Sequence[list[int]]) -> list[bool]:
    vocab = T.vocabulary()
    return [T.score(ex, [vocab[t] for t in a]) for ex, a in zip(examples, answers)]


def spec_run(target, model, examples: Sequence[T.Example]) -> tuple[list[list[int]], float]:
    from dllm.drafters.dflash.drafter import DFlashBlockDrafter
    from dllm.drafters.loop import speculative_generate
    from dllm.models.text.task_tokenizer import task_tokenizer

    tok, drafter = task_tokenizer(), DFlashBlockDrafter(model=model, sample=False)
    outs, forwards, tokens = [], 0, 0
    for ex in examples:
        res = speculative_generate(target, drafter, [T.prompt_ids(ex)], temperature=0.0, plan=16,
                                   max_new_tokens=T.answer_length(ex.task, ex.size) + 1, tokenizer=tok)
        outs.append(list(res.generated[0]))
        forwards += res.target_forwards
        tokens += len(res.generated[0])
    return outs, tokens / max(forwards, 1)


def main(argv: Optional[Sequence[str]] = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-size", type=int, default=4, help="test instances per task size")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default="int8,int4,nf4")
    ap.add_argument("--spec-n", type=int, default=1, help="speculative section: instances per size")
    ap.add_argument("--out", default="benchmarks/results/quantize.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods: list[Optional[str]] = [None] + [m for m in args.methods.split(",") if m]
    label = lambda m: m or "float32"  # noqa: E731
    lines = ["# Weight-only quantization of the embedded models", "",
             f"`python benchmarks/quantize.py --per-size {args.per_size} --threads {args.threads} "
             f"--methods {args.methods} --spec-n {args.spec_n}` on {platform.machine()} CPU "
             f"({args.threads} thread, shared machine: speeds are indicative); {versions()}.", ""]

    lines += ["## Weight bytes", "", "| model | " + " | ".join(label(m) for m in methods) + " |",
              "|---|" + "---:|" * len(methods)]
    for name in DIFFUSION + ("tiny-ar", "tiny-ar-draft", "tiny-ar-dflash"):
        sizes = [weight_bytes(load_any(name, m)) for m in methods]
        cells = [f"{sizes[0]:,}"] + [f"{s:,} ({sizes[0] / s:.2f}x)" for s in sizes[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    examples = eval_examples(per_size=args.per_size)
    lines += ["", f"## Diffusion models on PB-mini ({len(examples)} examples, low_confidence, 1 token/step)", "",
              "| model | method | accuracy % | vs float32 (points) | examples scored differently | tokens/s |",
              "|---|---|---:|---:|---:|---:|"]
    for name in DIFFUSION:
        base = None
        for m in methods:
            r = diffusion_run(load(name, quantization=m), examples)
            base = base or r
            diff = sum(a != b for a, b in zip(r["solved"], base["solved"]))
            lines.append(f"| {name} | {label(m)} | {100 * r['acc']:.1f} | {100 * (r['acc'] - base['acc']):+.1f} | "
                         f"{diff} | {r['tok_s']:.0f} |")
        print("\n".join(lines[-len(methods):]), flush=True)

    from dllm.models.targets import load_target

    ar_examples = eval_examples(AR_TASKS, per_size=args.per_size)
    lines += ["", f"## AR target tiny-ar, greedy ({len(ar_examples)} examples of its tasks)", "",
              "| method | accuracy % | vs float32 (points) | outputs equal to float32 | tokens/s |",
              "|---|---:|---:|---:|---:|"]
    ref: list[list[int]] = []
    ref_acc = 0.0
    for m in methods:
        answers, seconds = ar_greedy(load_target("tiny-ar", quantization=m)[0], ar_examples)
        acc = sum(ar_score(ar_examples, answers)) / len(ar_examples)
        ref, ref_acc = (answers, acc) if m is None else (ref, ref_acc)
        equal = sum(a == b for a, b in zip(answers, ref))
        tokens = sum(len(a) for a in answers)
        lines.append(f"| {label(m)} | {100 * acc:.1f} | {100 * (acc - ref_acc):+.1f} | {equal}/{len(answers)} | "
                     f"{tokens / seconds:.0f} |")
    print("\n".join(lines[-len(methods):]), flush=True)

    spec_examples = eval_examples(AR_TASKS, per_size=args.spec_n)
    target = load_target("tiny-ar")[0]
    greedy, _ = ar_greedy(target, spec_examples)
    lines += ["", f"## Speculative: tiny-ar (float32) + tiny-ar-dflash drafter, greedy, block 16 "
              f"({len(spec_examples)} prompts)", "",
              "| drafter | outputs equal to target greedy | tokens per target forward |", "|---|---:|---:|"]
    for m in methods:
        outs, tau = spec_run(target, load_any("tiny-ar-dflash", m), spec_examples)
        equal = sum(a == b for a, b in zip(outs, greedy))
        lines.append(f"| {label(m)} | {equal}/{len(outs)} | {tau:.2f} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()

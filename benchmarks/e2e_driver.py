"""End to end against Fast-dLLM's own driver: ours (``fast`` + ``auto``) against the project's
transcription of Fast-dLLM's ``generate_with_dual_cache`` (NVlabs/Fast-dLLM ``llada/generate.py``,
``tests/reference/decoders/fastdllm_generate.py``) on the same weights, and against the same setting inside
the engine (``threshold`` 0.9 + ``dual``).

    python benchmarks/e2e_driver.py --n 8 --repeats 5 --threads 1 --out benchmarks/results/e2e-driver.json

Fast-dLLM's driver has no padding, so every setting here decodes one prompt at a time (batch 1), on
the layout of ``dllm compare``: ``L_ans`` generated positions in blocks of ``min(4, L_ans)``, the last
one shorter where 4 does not divide ``L_ans`` (the driver's ``partial_last_block=True``; the original
asserts ``gen_length % block_length == 0``, and rounding ``gen_length`` up instead breaks the tiny
models, which read the answer length from the canvas: 19% against 77% on the short suite's first
example per task). Scored exactly like ``dllm compare`` (``dllm.tasks.score``), on the same examples
as ``python -m dllm.eval.bench.e2e`` (the LLaDA pairs: the transcription is of the LLaDA driver; Fast-dLLM's
Dream dual cache is not transcribed). Each setting is timed ``--repeats`` times in interleaved
rounds, the median wall reported; tokens/s counts the generated positions. The transcription's
tokens are checked against ``threshold:cache=dual``'s: the share of examples that agree is printed
(the driver may commit the mask id itself, which the engine never proposes; that is the only known
difference). Needs a checkout (it imports ``tests/reference/decoders``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the transcriptions are imported as tests.reference.*
sys.path.insert(0, str(ROOT))

from tests.reference.decoders.fastdllm_generate import FastDLLMLLaDA, generate_with_dual_cache  # noqa: E402

import dllm  # noqa: E402
from dllm import tasks as T  # noqa: E402
from dllm.eval.compare import task_examples as _examples  # noqa: E402
from dllm.scoring.exact_match import load_model  # noqa: E402

PAIRS = (("tiny-llada", "pb-mini"), ("tiny-llada-long", "long-prompt"))
DRIVER = "Fast-dLLM driver (dual, threshold 0.9)"
SETTINGS = (DRIVER, "threshold:cache=dual", "fast:cache=auto")
BLOCK = 4


def layout(ex: T.Example) -> tuple[int, int]:
    """(gen_length, block_length): ``dllm compare``'s layout of this example."""
    la = T.answer_length(ex.task, ex.size)
    return la, min(BLOCK, la)


def run_driver(model, ex: T.Example) -> tuple[list[int], int]:
    g, bl = layout(ex)
    prompt = torch.tensor([T.prompt_ids(ex)], dtype=torch.long, device=model.device)
    x, nfe = generate_with_dual_cache(FastDLLMLLaDA(model), prompt, steps=-(-g // bl), gen_length=g,
                                      block_length=bl, mask_id=model.mask_id, threshold=0.9, partial_last_block=True)
    return x[0, prompt.shape[1]:].tolist(), nfe


def run_engine(model, ex: T.Example, spec: str) -> tuple[list[int], int]:
    name, cache = spec.split(":cache=")
    g, bl = layout(ex)
    out = dllm.generate(model, [T.prompt_ids(ex)], name, gen_length=g, block_length=bl, cache=cache)
    return out.generated[0].tolist(), out.nfe


def one_pass(model, examples, setting: str) -> dict:
    t0 = time.perf_counter()
    outs = [run_driver(model, ex) if setting == DRIVER else run_engine(model, ex, setting) for ex in examples]
    wall = time.perf_counter() - t0
    correct = sum(T.score(ex, T.words_of(toks))
                  for ex, (toks, _) in zip(examples, outs))
    return {"wall": wall, "accuracy": correct / len(examples), "nfe": sum(n for _, n in outs),
            "tokens": [t for t, _ in outs]}


def measure(model_name: str, suite: str, n: int, repeats: int, device=None) -> dict:
    model = load_model(model_name, device=device)
    model.eval()
    examples = _examples(list(T.suite_task_names(suite)), n)
    generated = sum(layout(ex)[0] for ex in examples)
    with torch.no_grad():
        one_pass(model, examples[:4], DRIVER)  # warm-up, not recorded
        runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
        for _ in range(repeats):  # interleaved rounds
            for s in SETTINGS:
                runs[s].append(one_pass(model, examples, s))
    rows = {}
    for s, rs in runs.items():
        wall = statistics.median(r["wall"] for r in rs)
        rows[s] = {"accuracy": rs[0]["accuracy"], "nfe_per_example": rs[0]["nfe"] / len(examples),
                   "tokens_per_second": generated / wall, "wall": wall, "walls": [r["wall"] for r in rs]}
    same = sum(a == b for a, b in zip(runs[DRIVER][0]["tokens"], runs["threshold:cache=dual"][0]["tokens"]))
    return {"examples": len(examples), "generated_positions": generated, "rows": rows,
            "driver_equals_engine": same / len(examples)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8, help="test examples per task")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default=None, help="e.g. cuda (default: where dllm.models.load puts it)")
    ap.add_argument("--out", default=None, help="JSON file for the results")
    args = ap.parse_args()
    if args.n < 1 or args.repeats < 1:
        ap.error(f"--n and --repeats must be >= 1, got {args.n} and {args.repeats}")
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    for model_name, suite in PAIRS:
        r = measure(model_name, suite, args.n, args.repeats, args.device)
        results[f"{model_name}/{suite}"] = r
        print(f"\n== {model_name}/{suite}: {r['examples']} examples, batch 1, median of {args.repeats}; "
              f"driver tokens = engine's threshold:cache=dual on {100 * r['driver_equals_engine']:.1f}%")
        print(f"{'setting':<40}{'acc %':>7}{'NFE/ex':>8}{'tok/s':>9}{'wall s':>8}  x driver")
        base = r["rows"][DRIVER]["tokens_per_second"]
        for s, row in r["rows"].items():
            print(f"{s:<40}{100 * row['accuracy']:7.1f}{row['nfe_per_example']:8.2f}{row['tokens_per_second']:9.1f}"
                  f"{row['wall']:8.2f}  {row['tokens_per_second'] / base:.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"n_per_task": args.n, "repeats": args.repeats, "block": BLOCK,
                                              "results": results}, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The frontier against Fast-dLLM's own driver: for each of Fast-dLLM's points that its LLaDA driver
implements (``threshold`` 0.5 - 0.95 and ``factor`` 1.0 - 1.9 with the prefix and the dual cache;
NVlabs/Fast-dLLM ``llada/generate.py``, transcribed in ``tests/reference/decoders/fastdllm_generate.py``
and, for ``factor``, ``fastdllm_factor.py``), the driver at the batch size it supports (1: it has no
padding) against the setting ``dllm bench frontier`` picked for that point, in the engine at the batch it
runs (``decode_and_score``: one batch per task and answer length). A factor point is Fast-dLLM's code only
with ``rule=reference`` (the frontier's points since it has that option); a point of the rule as written
has no driver and is left out.

    dllm bench frontier --model tiny-llada --dev 4 --test 4 --margin 3 --out runs/frontier-tiny-llada
    python benchmarks/frontier_driver.py --frontier runs/frontier-tiny-llada/frontier.json \\
        --repeats 3 --threads 1 --out runs/frontier-tiny-llada

Same test instances as the frontier run (its ``--dev`` / ``--test``), same layout (``L_ans`` positions in
blocks of ``min(block, L_ans)``, the driver's last block shorter where the block does not divide
``L_ans``: ``partial_last_block``, the one change to the original loop), scored by ``dllm.tasks.score``.
Each pair is timed in ``--repeats`` interleaved rounds; the speed-up is the median of the per-round wall
ratios. The driver's verdicts are checked against the engine's run of the same point (the share of
examples both solve or both miss is printed; the tokens themselves are compared in
``tests/cache/test_fastdllm_transcript.py``, ``tests/samplers/test_factor_upstream.py``). Fast-dLLM's Dream
driver is not transcribed, so Dream frontiers are not compared here. Needs a checkout (it imports
``tests/reference/decoders``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the transcriptions are imported as tests.reference.*
sys.path.insert(0, str(ROOT))

from tests.reference.decoders.fastdllm_factor import (factor_generate_with_dual_cache,  # noqa: E402
                                                      factor_generate_with_prefix_cache)
from tests.reference.decoders.fastdllm_generate import (FastDLLMLLaDA,  # noqa: E402
                                                        generate_with_dual_cache, generate_with_prefix_cache)

from dllm import tasks as T  # noqa: E402
from dllm.eval.bench.frontier import run_setting  # noqa: E402
from dllm.scoring.exact_match import eval_examples, load_model  # noqa: E402
from dllm.settings import DecodeSettings  # noqa: E402

DRIVERS = {"prefix": generate_with_prefix_cache, "dual": generate_with_dual_cache}
FACTOR_DRIVERS = {"prefix": factor_generate_with_prefix_cache, "dual": factor_generate_with_dual_cache}


def driver_point(label: str) -> tuple[str, float, str] | None:
    """``threshold:threshold=0.9,cache=dual`` -> ("threshold", 0.9, "dual"),
    ``factor:factor=1.0,rule=reference,cache=prefix`` -> ("factor", 1.0, "prefix"); None for a point the
    driver lacks (another sampler or cache, other options, a factor point of the rule as written)."""
    s = DecodeSettings.parse(label)
    opts = s.sampler_options
    if s.cache not in DRIVERS:
        return None
    if s.name == "threshold" and set(opts) == {"threshold"}:
        return "threshold", float(opts["threshold"]), s.cache
    if s.name == "factor" and set(opts) == {"factor", "rule"} and opts["rule"] == "reference":
        return "factor", float(opts["factor"]), s.cache
    return None


def run_driver(model, ex: T.Example, rule: str, value: float, cache: str, block: int) -> list[int]:
    g = T.answer_length(ex.task, ex.size)
    bl = min(block, g)
    prompt = torch.tensor([T.prompt_ids(ex)], dtype=torch.long, device=model.device)
    if rule == "factor":
        x, _ = FACTOR_DRIVERS[cache](FastDLLMLLaDA(model), prompt, gen_length=g, block_length=bl,
                                     mask_id=model.mask_id, factor=value, partial_last_block=True)
    else:
        x, _ = DRIVERS[cache](FastDLLMLLaDA(model), prompt, steps=-(-g // bl), gen_length=g, block_length=bl,
                              mask_id=model.mask_id, threshold=value, partial_last_block=True)
    return x[0, prompt.shape[1]:].tolist()


def driver_pass(model, examples, rule: str, value: float, cache: str, block: int) -> dict:
    t0 = time.perf_counter()
    outs = [run_driver(model, ex, rule, value, cache, block) for ex in examples]
    wall = time.perf_counter() - t0
    solved = [bool(T.score(ex, T.words_of(toks))) for ex, toks in zip(examples, outs)]
    return {"wall": wall, "accuracy": sum(solved) / len(examples), "solved": solved}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frontier", required=True, help="frontier.json of a `dllm bench frontier` run on a LLaDA model")
    ap.add_argument("--block-length", type=int, default=4, help="the frontier run's --block-length")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="folder for frontier-driver.json / .txt")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    doc = json.loads(Path(args.frontier).read_text())
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(doc["model"])
    model.eval()
    examples = eval_examples(T.suite_task_names(doc["suite"]), doc["test_per_size"], skip=doc["dev_per_size"])
    generated = sum(T.answer_length(ex.task, ex.size) for ex in examples)
    pairs = {p: c for p, c in doc["picks"].items() if c and driver_point(p) and p in doc["points"]
             and " @ block=" not in p}
    if not pairs:
        ap.error(f"{args.frontier}: no threshold or factor:rule=reference point with the prefix / dual cache and a pick")
    with torch.no_grad():
        driver_pass(model, examples[:4], "threshold", 0.9, "dual", args.block_length)  # warm-up, not recorded
        walls: dict[str, list[float]] = {k: [] for p in pairs for k in (p, "driver " + p)}
        first: dict[str, dict] = {}
        bar = tqdm(total=args.repeats * len(pairs), desc="driver vs picks", unit="pair", disable=args.no_progress)
        for _ in range(args.repeats):  # interleaved rounds
            for p, c in pairs.items():
                d = driver_pass(model, examples, *driver_point(p), args.block_length)
                first.setdefault("driver " + p, d)
                walls["driver " + p].append(d["wall"])
                r = run_setting(model, c, examples, args.block_length)
                first.setdefault(p, {"accuracy": r.accuracy})
                walls[p].append(r.wall_time)
                bar.update(1)
        bar.close()
        engine_tokens = {p: run_setting(model, p, examples, args.block_length) for p in pairs}  # the same point, engine
    rows = {}
    lines = [f"{doc['model']}, {doc['suite']}: {len(examples)} test examples, driver at batch 1, ours batched; "
             f"median of {args.repeats} interleaved rounds",
             f"{'Fast-dLLM driver point':<40}{'acc %':>7}{'tok/s':>8}  {'ours (frontier pick)':<44}{'acc %':>7}"
             f"{'tok/s':>8}{'x driver':>10}{'engine acc %':>14}{'same verdicts':>15}"]
    for p, c in pairs.items():
        d = first["driver " + p]
        ratios = [dw / ow for dw, ow in zip(walls["driver " + p], walls[p])]
        solved = engine_tokens[p].extra["solved"]  # per example, in order: "1" solved
        agree = sum((s == "1") == ok for s, ok in zip(solved, d["solved"])) / len(examples)
        rows[p] = {"pick": c, "accuracy_driver": d["accuracy"], "accuracy_ours": first[p]["accuracy"],
                   "tokens_per_second_driver": generated / statistics.median(walls["driver " + p]),
                   "tokens_per_second_ours": generated / statistics.median(walls[p]),
                   "speed_ratio": round(statistics.median(ratios), 3), "speed_ratio_rounds": [round(x, 3) for x in ratios],
                   "accuracy_engine_point": engine_tokens[p].accuracy, "same_verdicts_as_engine": round(agree, 4)}
        row = rows[p]
        lines.append(f"{p:<40}{100 * row['accuracy_driver']:7.1f}{row['tokens_per_second_driver']:8.0f}  {c:<44}"
                     f"{100 * row['accuracy_ours']:7.1f}{row['tokens_per_second_ours']:8.0f}{row['speed_ratio']:10.2f}"
                     f"{100 * row['accuracy_engine_point']:14.1f}{100 * agree:14.1f}%")
    lines.append("(engine acc: the same point in the engine, batched; same verdicts: the share of examples the driver "
                 "and the engine both solve or both miss)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "frontier-driver.json").write_text(json.dumps({"frontier": args.frontier, "repeats": args.repeats,
                                                              "examples": len(examples), "rows": rows}, indent=2))
        (out / "frontier-driver.txt").write_text(f"$ python benchmarks/frontier_driver.py "
                                                 f"{' '.join(sys.argv[1:])}\n\n{text}\n")
        print(f"wrote {out / 'frontier-driver.json'} and {out / 'frontier-driver.txt'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

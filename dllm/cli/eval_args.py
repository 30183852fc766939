"""The flags of the evaluation commands: ``dllm compare``, ``dllm stress``, ``dllm eval tasks``.

They run in ``dllm.eval`` (``run_compare``, ``run_stress_cli``, ``run_eval_tasks``: the rows of
``dllm.cli.table``), which check everything else before loading a model.
"""

from __future__ import annotations

import argparse
from typing import Any

from dllm.cli.args import POSITIVE, add_model_place, add_threads, output_dir, output_file
from dllm.flags import Distinct


class TaskNames(Distinct):
    """``--tasks``: distinct task names, at least one when the flag is given. A bare ``--tasks`` (say, an
    empty shell variable) is an error, not the default suite: leaving the flag out runs that."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Any = None) -> None:
        if not values:
            parser.error(f"argument {option_string}: expected at least one task name, e.g. {option_string} copy sort "
                         f"(`dllm tasks` lists them); leave {option_string} out for the PB-mini suite")
        super().__call__(parser, namespace, values, option_string)


def compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llada",
                   help="model path/name (default: the embedded tiny-llada), or 'oracle' (exact posteriors)")
    p.add_argument("--samplers", nargs="*", default=None,
                   help="sampler specs: name or name:key=value,... (k=N: N tokens per step)")
    p.add_argument("--tasks", nargs="*", action=TaskNames, default=None, help="default: the PB-mini suite")
    p.add_argument("--n", type=POSITIVE, default=4, help="test examples per task")
    p.add_argument("--block-length", type=POSITIVE, default=None, help="default: the answer length")
    p.add_argument("--repeats", type=POSITIVE, default=1,
                   help="timed runs per sampler, interleaved; the median wall time is reported")
    p.add_argument("--out", type=output_dir, default="runs/compare", help="a directory: compare.json and compare.png")
    add_model_place(p, dtype="float32")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="every sampler's cached forwards replayed as CUDA graphs (a CUDA model; default: off)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_threads(p, "1 on a busy machine")


def stress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-llada",
                   help="model path/name, 'oracle' (exact posteriors) or 'oracle:noise_std=0.05' (with logit noise)")
    p.add_argument("--grid", action="append", default=None, metavar="SPEC",
                   help="repeatable; one sampler family: SAMPLER[:OPTION=V1,V2,...,OPTION=V,...], k = tokens "
                        "per step (low_confidence:k=1,2,4,8 threshold:threshold=0.5,0.7,0.9); default: sweeps "
                        "of low_confidence, random, threshold, factor, and fast (dllm.eval.stress.grid)")
    p.add_argument("--block-lengths", default="0", metavar="B1,B2,...",
                   help="semi-autoregressive block lengths crossed with every setting (0 = one block)")
    p.add_argument("--caches", default="none", metavar="C1,C2,...",
                   help="KV-cache policies crossed with every setting, each a spec as generate(cache=...) takes it "
                        "(none = no cache, prefix, dual, dual:look_back=16, ...; a spec with several options in "
                        "parentheses, '(dual:look_back=16,look_ahead=16)', or with semicolons; default: none)")
    p.add_argument("--tasks", nargs="*", action=TaskNames, default=None, help="default: the PB-mini suite")
    p.add_argument("--per-size", type=POSITIVE, default=4, help="test examples per task size")
    p.add_argument("--out", type=output_dir, default="runs/stress", help="a directory: stress.json, stress.txt, PNGs")
    p.add_argument("--resume", action="store_true", help="continue OUT/stress.json (same model, tasks, grid, caches)")
    p.add_argument("--metrics", default="dllm", metavar="dllm|parallelbench[:OPTION=VALUE,...]",
                   help="summary definitions: dllm (default) or ParallelBench's (nominal-k TPS, interpolated "
                        "leaderboard, pooled oracle, its Kendall tau, order-preference slope); options eos=drop|cut, "
                        "shuffle=strict|any, tau_pad=keep|drop, slope_k=N (dllm.eval.stress.parallelbench)")
    add_model_place(p, dtype="float32")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_threads(p, "1 on a busy machine")


def eval_tasks_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a model name or path (tiny-llada, oracle, ...)")
    p.add_argument("--tasks", nargs="*", action=TaskNames, default=None, help="default: the PB-mini suite")
    p.add_argument("--k", type=int, nargs="*", action=Distinct, default=None,
                   help="tokens per step, fixed-step samplers only (default: 1)")
    p.add_argument("--per-size", type=POSITIVE, default=4, help="test examples per task size")
    p.add_argument("--skip", type=int, default=0,
                   help="start at test instance SKIP of each size (a sample disjoint from --per-size SKIP's)")
    p.add_argument("--sampler", default="low_confidence",
                   help="sampler spec; an adaptive one gets a single column and no --k")
    add_model_place(p, dtype="float32")
    p.add_argument("--json", type=output_file, default=None, metavar="PATH", help="also write the table to this JSON file")
    add_threads(p, "1 on a busy machine")

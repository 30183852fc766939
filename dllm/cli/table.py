"""Every ``dllm`` command, in one table: its words, its help line and the module path of what runs it.

This file is the one place that names, as strings, the modules the commands run (``dllm.cli.registry``
imports them only when a command runs): a module that moves is a one-line edit here, and
tests/cli/test_registry.py checks that every target still resolves and that every ``python -m``
entry point in ``dllm`` has its row.

Older spellings stay as aliases (``dllm eval-tasks`` = ``dllm eval tasks``); ``--help`` shows the
canonical ones. ``python -m dllm.eval.harness`` stays lm-eval's own command line (``dllm eval harness``
runs the same).
"""

from __future__ import annotations

from dllm.cli.registry import Command, Group, Registry

DESCRIPTION = "Fast decoding for diffusion language models: samplers, caches, kernels, speculative decoding."

GROUPS = (
    Group("bench", "benchmarks: speed and accuracy tables; the measured choices of `fast` and `auto`"),
    Group("eval", "evaluation: exact match on the stress tasks; lm-evaluation-harness"),
    Group("train", "training: the shipped models' recipes; the drafters' heads; export into the package"),
    Group("models", "the embedded checkpoints"),
)

_CORE = "dllm.cli.core"
_ARGS = "dllm.cli.args"
_EVAL_ARGS = "dllm.cli.eval_args"
_BENCH = "dllm.cli.bench"

COMMANDS = (
    # everyday verbs
    Command("", "generate", "decode a prompt with a sampler (and a cache)",
            build=f"{_CORE}:generate_args", target=f"{_CORE}:run_generate"),
    Command("", "compare", "samplers side by side on the stress tasks: accuracy, tokens per forward, time",
            build=f"{_EVAL_ARGS}:compare_args", target="dllm.eval.compare:run_compare", aliases=("eval compare",)),
    Command("", "stress", "ParallelBench-style sweep: samplers x parallelism x tasks, accuracy vs tokens per step "
                          "(resumable)",
            build=f"{_EVAL_ARGS}:stress_args", target="dllm.eval.stress.sweep:run_stress_cli", aliases=("eval stress",)),
    Command("", "spec", "lossless speculative decoding: an autoregressive target, a drafter",
            build="dllm.cli.speculative:spec_args", target="dllm.cli.speculative:run_spec"),
    Command("", "samplers", "list the registered samplers",
            build=f"{_ARGS}:no_options", target=f"{_CORE}:run_samplers"),
    Command("", "drafters", "list the registered drafters",
            build=f"{_ARGS}:no_options", target=f"{_CORE}:run_drafters"),
    Command("", "tasks", "list the stress tasks", build=f"{_ARGS}:no_options", target=f"{_CORE}:run_tasks"),
    Command("", "info", "family, sizes and special ids of a model", build=f"{_CORE}:info_args",
            target=f"{_CORE}:run_info"),
    Command("", "serve", "an OpenAI-compatible server (continuous batching, streaming, the page at /) for a "
                         "diffusion model or an AR target with a drafter",
            build="dllm.cli.serve:serve_args", target="dllm.cli.serve:run_serve"),
    # dllm bench
    Command("bench", "spec", "speculative decoding of an AR target: drafters vs target.generate, assisted "
                             "generation, prompt lookup", target="dllm.eval.speculative.bench:main"),
    Command("bench", "trees", "draft trees vs their budget: tree builders x budgets, the budget chosen on held-out "
                             "prompts",
            target="dllm.eval.speculative.trees:main"),
    Command("bench", "e2e", "end to end: the recommended setting against Fast-dLLM's on the accuracy / "
                            "tokens-per-second plane", target="dllm.eval.bench.e2e:main"),
    Command("bench", "breakdown", "where a decode step's time goes at LLaDA-8B width (per layer, head, "
                                  "statistics, engine)", target="dllm.eval.bench.breakdown:main"),
    Command("bench", "kernels", "attention backends and the fused vocabulary-statistics kernel vs sdpa / the "
                                "reference", build=f"{_BENCH}:kernels_args", target=f"{_BENCH}:run_kernels",
            stands_for="dllm.eval.bench.kernels"),
    Command("bench", "caches", "cache policies x samplers on a long prompt, side by side",
            build=f"{_BENCH}:caches_args", target=f"{_BENCH}:run_caches"),
    Command("bench", "throughput", "forward and generate throughput of a model",
            build=f"{_BENCH}:throughput_args", target="dllm.eval.bench.throughput:run_throughput"),
    Command("bench", "serve", "a load generator against `dllm serve`: Poisson arrivals, requests/s, TTFT and "
                              "latency p50/p99 for continuous, static and serial serving", target="dllm.eval.bench.serving.serve:main"),
    Command("bench", "frontier", "the accuracy / tokens-per-second frontier against Fast-dLLM's threshold and "
                                 "factor points (chosen on dev, reported on test)", target="dllm.eval.bench.frontier:main"),
    Command("bench", "choose-fast", "choose the `fast` sampler alias by measurement",
            target="dllm.eval.bench.choose.fast:main"),
    Command("bench", "choose-cache", "choose the `auto` cache policy by measurement",
            target="dllm.eval.bench.choose.cache:main"),
    # dllm eval
    Command("eval", "tasks", "exact match on the stress-task test split at k tokens per step",
            build=f"{_EVAL_ARGS}:eval_tasks_args", target="dllm.eval.task_eval:run_eval_tasks",
            aliases=("eval-tasks",)),
    Command("eval", "harness-tasks", "write the stress tasks' JSONL files for lm-evaluation-harness",
            target="dllm.eval.harness.tasks:main"),
    Command("eval", "harness", "lm-evaluation-harness with the dllm model and the stress tasks (lm-eval's "
                               "flags)", target="dllm.eval.harness:main"),
    # dllm train
    Command("train", "recipe", "train a recipe end to end (dllm train --recipe tiny-llada)",
            target="dllm.train.__main__:main", default=True),
    Command("train", "path-head", "train a DFlash drafter's path head (the taps tree builder's estimates)",
            target="dllm.train.drafters.path_head_train:main"),
    Command("train", "block-head", "train a DFlash drafter's block head (the plan per prompt of --block-size auto)",
            target="dllm.train.drafters.block_head_train:main"),
    Command("train", "export", "copy a trained checkpoint into the package as an embedded model",
            target="dllm.train.export:main"),
    # dllm models
    Command("models", "make-embedded", "regenerate the tiny random checkpoints shipped in dllm/models/embedded",
            target="dllm.models.make_embedded:main"),
)

REGISTRY = Registry(GROUPS, COMMANDS, prog="dllm", description=DESCRIPTION)

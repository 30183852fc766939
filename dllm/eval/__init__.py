"""Evaluation: sampler comparisons, stress sweeps, the lm-eval model, benchmarks.

Top level: ``compare`` (``dllm compare``), ``task_eval`` (``dllm eval-tasks``), ``order_plot`` (the
unmasking-order plot of ``dllm generate --order-png``), ``interrupt`` (Ctrl-C: the finished part
written). Sub-packages: ``stress`` (``dllm stress``), ``harness`` (the lm-evaluation-harness model;
``python -m dllm.eval.harness``), ``speculative`` (``dllm bench spec`` and ``dllm bench trees``:
speculative decoding and draft trees), ``bench`` (throughput, caches, kernels, the step breakdown,
end to end, and the measurements that choose ``fast`` and ``auto``). Decoding and exact-match
scoring live below, in ``dllm.scoring`` (training uses them too): every command here decodes with
one ``dllm.settings.DecodeSettings`` through one ``decode_and_score`` loop.
"""

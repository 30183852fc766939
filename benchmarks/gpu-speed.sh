#!/usr/bin/env bash
# The speed issue's GPU numbers, for a session lent a GPU after benchmarks/gpu-check.sh (`run` tool;
# install first: pip install --no-deps --no-build-isolation -e .):
#   the per-component breakdown at LLaDA-8B width (2 layers, float32 and bfloat16, eager and with
#   torch.compile) and the end-to-end comparison (fast + auto against Fast-dLLM's threshold + dual)
#   on the four embedded model / suite pairs, and Fast-dLLM's transcribed driver beside it at batch 1.
# Writes everything under ${OUT:-benchmarks/gpu-speed-$(date +%F)}; at most 10 minutes (the timeouts: 580 s).
set -uo pipefail
O=${OUT:-benchmarks/gpu-speed-$(date +%F)}
mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$O/gpu.txt" 2>&1
unset TRITON_INTERPRET
timeout 130 dllm bench breakdown --device cuda --json "$O/breakdown.json" > "$O/breakdown.txt" 2>&1
timeout 130 dllm bench breakdown --device cuda --compile --json "$O/breakdown-compile.json" \
  > "$O/breakdown-compile.txt" 2>&1
timeout 200 python -m dllm.eval.e2e --n 8 --device cuda --no-progress --out "$O/e2e" > "$O/e2e.txt" 2>&1
timeout 120 python tests/reference/e2e_driver.py --n 8 --repeats 3 --device cuda --out "$O/e2e-driver.json" \
  > "$O/e2e-driver.txt" 2>&1
tail -n 3 "$O"/*.txt

#!/usr/bin/env bash
# The GPU device checks, as one script for a session that is lent a GPU (`run` tool):
#   kernel correctness compiled on the GPU (tests/kernels, including the fused sampler statistics),
#   kernel timings on LLaDA-8B-like shapes, and the long-prompt cache benchmark on CUDA.
# Writes everything under ${OUT:-benchmarks/gpu-$(date +%F)}; ~5 minutes on an H200 (estimate).
set -uo pipefail
O=${OUT:-benchmarks/gpu-$(date +%F)}
mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$O/gpu.txt" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >> "$O/gpu.txt" 2>&1
unset TRITON_INTERPRET
timeout 240 python -m pytest -q tests/kernels -p no:cacheprovider > "$O/pytest-kernels.txt" 2>&1; echo "pytest rc=$?" >> "$O/pytest-kernels.txt"
timeout 120 dllm bench kernels --device cuda --json "$O/bench-kernels.json" > "$O/bench-kernels.txt" 2>&1
for m in tiny-random-llada tiny-llada; do
  timeout 120 dllm bench caches --model "$m" --device cuda --samplers low_confidence threshold fast \
    --json "$O/bench-caches-$m.json" > "$O/bench-caches-$m.txt" 2>&1
done
tail -n 3 "$O"/*.txt

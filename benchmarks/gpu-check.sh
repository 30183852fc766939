#!/usr/bin/env bash
# The GPU device checks, for a session lent a GPU (`run` tool; install first:
# pip install --no-deps --no-build-isolation -e .): kernel correctness compiled on the GPU (tests/kernels,
# including the fused sampler statistics), kernel timings on LLaDA-8B-like shapes, and the long-prompt
# cache benchmark. Writes under ${OUT:-benchmarks/gpu-$(date +%F)}; ~5 minutes on an H200 (estimate; the limits
# add to 500 s, under the device tool's 600 s per command with each step's 20 s grace).
# DEVICE=cpu bash benchmarks/gpu-check.sh runs the same steps on a CPU (the interpreter, a few tests).
O=${OUT:-benchmarks/gpu-$(date +%F)}
. "$(dirname "$0")/lib-gpu.sh"
if [ "$DEVICE" = cuda ]; then
  TESTS=(tests/kernels); CACHES=(); MODELS=(tiny-random-llada tiny-llada); KERNELS=()
else
  TESTS=(tests/kernels/test_launch.py tests/kernels/test_auto_probe.py tests/kernels/test_fused_ops.py); CACHES=(--prompt-length 32 --gen-length 16 --block-length 8 --layers 1 --repeats 1)
  MODELS=(tiny-random-llada); KERNELS=(--tiny --repeats 1)
fi
step 180 pytest-kernels.txt python3 -m pytest -q "${TESTS[@]}" -p no:cacheprovider
step 120 bench-kernels.txt dllm bench kernels --device "$DEVICE" "${KERNELS[@]}" --json "$O/bench-kernels.json"
for m in "${MODELS[@]}"; do
  step 100 "bench-caches-$m.txt" dllm bench caches --model "$m" --device "$DEVICE" "${CACHES[@]}" \
    --samplers low_confidence threshold fast --json "$O/bench-caches-$m.json"
done
finish

#!/usr/bin/env bash
# The speed issue's GPU numbers, for a session lent a GPU after benchmarks/gpu-check.sh (`run` tool;
# install first: pip install --no-deps --no-build-isolation -e .): the per-component breakdown at
# LLaDA-8B width (2 layers, float32 and bfloat16, eager and with torch.compile), the end-to-end
# comparison (fast + auto against Fast-dLLM's threshold + dual) on the embedded model / suite pairs, and
# Fast-dLLM's transcribed driver beside it at batch 1. Writes under ${OUT:-benchmarks/gpu-speed-$(date +%F)};
# at most 10 minutes (the limits). DEVICE=cpu bash benchmarks/gpu-speed.sh: tiny shapes, few examples.
O=${OUT:-benchmarks/gpu-speed-$(date +%F)}
. "$(dirname "$0")/lib-gpu.sh"
if [ "$DEVICE" = cuda ]; then
  W=(); COMPILE=(--compile); N=8; REPEATS=3; PAIRS=()
else
  W=(--width tiny --prompt-length 64 --caches dual); COMPILE=(--compile eager); N=1; REPEATS=1; PAIRS=(--pairs tiny-llada/pb-mini)
fi
step 130 breakdown.txt dllm bench breakdown --device "$DEVICE" "${W[@]}" --json "$O/breakdown.json"
step 130 breakdown-compile.txt dllm bench breakdown --device "$DEVICE" "${W[@]}" "${COMPILE[@]}" \
  --json "$O/breakdown-compile.json"
step 200 e2e.txt dllm bench e2e --n "$N" --repeats "$REPEATS" --device "$DEVICE" "${PAIRS[@]}" --no-progress \
  --out "$O/e2e"
step 120 e2e-driver.txt python3 benchmarks/e2e_driver.py --n "$N" --repeats "$REPEATS" --device "$DEVICE" \
  --out "$O/e2e-driver.json"
finish

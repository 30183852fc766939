#!/usr/bin/env bash
# The speed issue's GPU numbers, for a session lent a GPU after benchmarks/gpu-check.sh (`run` tool;
# install first: pip install --no-deps --no-build-isolation -e .): the per-component breakdown at
# LLaDA-8B width (2 layers, float32 and bfloat16, eager), the end-to-end comparison (fast + auto against
# Fast-dLLM's threshold + dual, both in dllm's engine) on the embedded model / suite pairs, eager and on
# CUDA with every setting's cached forwards replayed as CUDA graphs (--cuda-graphs: issue 44's goal,
# fast + auto >= 1.5x Fast-dLLM's tokens/s), and Fast-dLLM's transcribed driver (its own loop) beside
# them at batch 1. The torch.compile breakdown (`dllm bench breakdown --compile`) is left to a later run
# (benchmarks/results/breakdown-compile-llada8b.txt). Writes 8 files under ${OUT:-benchmarks/gpu-speed-$(date +%F)}
# (the device brings back at most 8: gpu.txt, log.txt with every step's table, and 6 JSON and plot files);
# at most 10 minutes (the limits add to 560 s). DEVICE=cpu bash benchmarks/gpu-speed.sh: tiny shapes, few
# examples, no graphs step (CUDA graphs need CUDA).
O=${OUT:-benchmarks/gpu-speed-$(date +%F)}
. "$(dirname "$0")/lib-gpu.sh"
if [ "$DEVICE" = cuda ]; then
  W=(); N=8; REPEATS=3; PAIRS=()
else
  W=(--width tiny --prompt-length 64 --caches dual); N=1; REPEATS=1; PAIRS=(--pairs tiny-llada/pb-mini)
fi
step 120 log.txt dllm bench breakdown --device "$DEVICE" "${W[@]}" --json "$O/breakdown.json"
step 170 log.txt dllm bench e2e --n "$N" --repeats "$REPEATS" --device "$DEVICE" "${PAIRS[@]}" --no-progress \
  --out "$O/e2e"
if [ "$DEVICE" = cuda ]; then
  step 160 log.txt dllm bench e2e --n "$N" --repeats "$REPEATS" --device "$DEVICE" "${PAIRS[@]}" \
    --cuda-graphs --no-progress --out "$O/e2e-graphs"
fi
step 110 log.txt python3 benchmarks/e2e_driver.py --n "$N" --repeats "$REPEATS" --device "$DEVICE" \
  --out "$O/e2e-driver.json"
finish

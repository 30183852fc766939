#!/usr/bin/env bash
# The GPU step issue's numbers, for a session lent a GPU (`run` tool). The device has torch, triton and
# transformers; install the project first: pip install --no-deps --no-build-isolation -e .
#   1. per-step ms at LLaDA-8B width (random bf16 weights) with 8 layers: none / prefix / dual, batch 1
#      and 8, with the GPU-busy share and kernel launches per step from the profiler (breakdown-8.json);
#   2. the same at 32 layers, dual, batch 1 (against the 3.7 ms weight-read floor; breakdown-32.json);
#      with 8 layers and dual, the norms and RoPE as ATen ops (--layer-paths fused) against the one-launch
#      operators that CUDA's default path runs (breakdown-paths.json: fewer launches, more host per call);
#   3. SDAR-8B's shapes with its block cache (block 4; one step timed after 3: a block's shape is captured
#      at its second cached forward and replayed from its third; breakdown-sdar.json);
#   4. Fast-dLLM's transcribed dual-cache driver against dllm's loop at the same shapes (3 rounds of 3
#      decodes per setting, to fit its 60 s with eight settings; fast with LoPA's kernels; in log.txt);
#   5. dllm bench kernels: every attention backend and auto's choice, as ratios to sdpa, and fast's
#      sampler step with LoPA's kernels against the torch path (kernels.json).
# First, the check that the graphs are right: tests/test_graphs.py's CUDA test (real CUDA graphs give the
# eager tokens: LLaDA dual, SDAR block, LLaDA 2's grouped experts; skipped on a CPU).
# Steps 1-3 time each case eager and with generate(cuda_graphs=True) (the cached forwards replayed as
# CUDA graphs; on a CPU the same static step runs eagerly).
# 8 files under ${OUT:-benchmarks/gpu-step-$(date +%F)} (gpu.txt, log.txt with every table, 6 JSON); about
# 5 minutes on an H200 (the limits add to 410 s; bench kernels gets 45 s for the Triton compiles the earlier steps left). DEVICE=cpu bash benchmarks/gpu-step.sh: tiny shapes.
O=${OUT:-benchmarks/gpu-step-$(date +%F)}
. "$(dirname "$0")/lib-gpu.sh"
if [ "$DEVICE" = cuda ]; then
  W=(--width 8b); P=1024; L8=8; L32=32; DRIVER=(--width 8b --layers 8 --rounds 3 --repeat 3); KERNELS=()
else
  W=(--width tiny); P=64; L8=2; L32=3; DRIVER=(--layers 1 --rounds 1 --repeat 1); KERNELS=(--repeats 1 --tiny)
fi
step 60 log.txt python3 -m pytest -q -p no:cacheprovider tests/test_graphs.py -k cuda_graphs_give_the_eager_tokens
B=(dllm bench breakdown --device "$DEVICE" "${W[@]}" --dtypes bfloat16 --sampler low_confidence --steps 5 --warmup 3
   --cuda-graphs)
step 45 log.txt "${B[@]}" --layers "$L8" --prompt-length "$P" --block-length 32 --caches none,prefix,dual \
  --json "$O/breakdown-8.json"
step 40 log.txt "${B[@]}" --layers "$L8" --prompt-length "$P" --block-length 32 --caches none,dual --batch 8 \
  --json "$O/breakdown-8-batch8.json"
step 70 log.txt "${B[@]}" --layers "$L32" --prompt-length "$P" --block-length 32 --caches dual \
  --json "$O/breakdown-32.json"
step 40 log.txt "${B[@]}" --layers "$L8" --prompt-length "$P" --block-length 32 --caches dual \
  --layer-paths fused,ops --json "$O/breakdown-paths.json"
step 50 log.txt "${B[@]}" --family sdar --layers "$L8" --prompt-length "$P" --block-length 4 \
  --caches block --warmup 3 --steps 1 --json "$O/breakdown-sdar.json"
step 60 log.txt python3 benchmarks/step_overhead.py "${DRIVER[@]}" --device "$DEVICE" --prompt-length "$P" \
  --gen-length 32 --block-length 32 --threads 4
step 45 log.txt dllm bench kernels --device "$DEVICE" "${KERNELS[@]}" --json "$O/kernels.json"
finish

#!/usr/bin/env bash
# fast's variant batches on a GPU, for a session lent a GPU after benchmarks/gpu-step.sh (`run` tool;
# install first: pip install --no-deps --no-build-isolation -e .). On CUDA `fast` forwards its lookahead
# variants with static shapes (compact="auto": no host read of the candidate counts, so the variant forward
# runs even where the anchor filled every block). On this CPU that costs forwards: with the e2e pair
# tiny-llada / short (blocks of 4) fast forwards 7.66 times an example with static batches, 5.24 compacted,
# 6.13 for threshold + dual (docs/results/caches.md). Whether static batches pay on a GPU, where a forward
# of these tiny models is a few launches (one replay with --cuda-graphs) and a host read stalls the queue,
# is what this times: threshold + dual (Fast-dLLM's setting), fast + auto as on CUDA (static), static with
# one read at a block's first step (compact=block: 6.00 forwards an example on this CPU), compacted
# (compact=True), and the forwards-cost candidate (branches=8; dllm bench choose-fast --cost forwards),
# on the two short e2e pairs: tiny-llada eager and with CUDA graphs, tiny-dream with graphs. The tokens/s
# columns decide compact="auto". Writes 8 files under ${OUT:-benchmarks/gpu-fast-$(date +%F)} (gpu.txt, log.txt
# with every table, a compare.json and compare.png per run); the limits add to 300 s. DEVICE=cpu bash
# benchmarks/gpu-fast.sh: the same runs on one example of three tasks, eager.
O=${OUT:-benchmarks/gpu-fast-$(date +%F)}
. "$(dirname "$0")/lib-gpu.sh"
if [ "$DEVICE" = cuda ]; then
  N=8; REPEATS=3; TASKS=()
else
  N=1; REPEATS=1; TASKS=(--tasks copy add_lsb chain)
fi
SAMPLERS=("threshold:cache=dual" "fast:cache=auto" "fast:compact=block,cache=auto" "fast:compact=True,cache=auto"
          "fast:branches=8,cache=auto")
run() {  # MODEL MODE
  local graphs=()
  [ "$2" = graphs ] && graphs=(--cuda-graphs)
  step 100 log.txt dllm compare --model "$1" --device "$DEVICE" --block-length 4 --n "$N" --repeats "$REPEATS" \
    --samplers "${SAMPLERS[@]}" "${graphs[@]}" "${TASKS[@]}" --no-progress --out "$O/$1-$2"
}
run tiny-llada eager
if [ "$DEVICE" = cuda ]; then
  run tiny-llada graphs
  run tiny-dream graphs
else
  run tiny-dream eager
fi
finish

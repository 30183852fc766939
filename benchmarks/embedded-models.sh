#!/usr/bin/env bash
# Numbers for the embedded models (README "Measured"): per-task exact match at k = 1, 2, 4 tokens
# per step, the sampler comparison (with every candidate of `dllm bench choose-fast`, which then picks
# `fast`), the stress-suite accuracy of each cache policy, and the long-prompt cache benchmark.
# One model per core (one torch thread each); writes under benchmarks/results/ (the latest run only;
# git keeps the earlier ones). Tables for the docs: python benchmarks/tables.py
set -euo pipefail
R=benchmarks/results
run_model() {
  m=$1
  dllm eval tasks --model "$m" --k 1 2 4 --per-size 8 --threads 1 --json "$R/eval-tasks-$m.json"
  dllm compare --model "$m" --threads 1 --n 8 --no-progress --out "$R/compare-$m" --samplers \
    low_confidence low_confidence:k=2 threshold threshold:threshold=0.8 threshold:threshold=0.7 factor \
    eb:gamma=0.01 eb:gamma=0.1 localleap hierarchy credit klass dawn wino ssd spec_threshold \
    spec_threshold:threshold=0.95 spec_threshold:threshold=0.99 lopa prophet dus
  dllm compare --model "$m" --threads 1 --n 8 --block-length 4 --no-progress --out "$R/caches-$m" \
    --samplers low_confidence low_confidence:cache=prefix low_confidence:cache=dual low_confidence:cache=window \
    threshold threshold:cache=prefix threshold:cache=dual threshold:cache=window fast fast:cache=dual \
    low_confidence:cache=dual:look_back=16 low_confidence:cache=dual:look_back=64 \
    threshold:cache=dual:look_back=16 threshold:cache=dual:look_back=64 \
    wino wino:cache=dual wino:cache=dual:look_back=64
  dllm bench caches --model "$m" --samplers low_confidence threshold fast wino --threads 1 \
    --caches none prefix dual window dual:look_back=16 dual:look_back=64 \
    --json "$R/bench-caches-$m.json"
}
# usage: benchmarks/embedded-models.sh [MODEL ...]   (default: both, side by side)
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(tiny-llada tiny-dream)
for m in "${models[@]}"; do
  run_model "$m" > "$R/eval-tasks-$m.txt" 2>&1 &
done
wait
if [ -f "$R/compare-tiny-llada/compare.json" ] && [ -f "$R/compare-tiny-dream/compare.json" ]; then
  dllm bench choose-fast --results "$R/compare-tiny-llada/compare.json" \
    "$R/compare-tiny-dream/compare.json" --out "$R/fast-choice.json"
fi

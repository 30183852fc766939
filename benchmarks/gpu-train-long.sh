#!/usr/bin/env bash
# Long-prompt suite training on a GPU, for a session lent one, after benchmarks/gpu-check.sh (`run` tool):
#   pip install --no-deps --no-build-isolation -e . -q && SECS=150 bash benchmarks/gpu-train-long.sh
# with timeout_s ~ 2 * SECS + 400 (two models, each then evaluated and exported; size SECS from status'
# budget_left_s).
# On this project's CPU the long models plateaued at C = 0 means of 66.7% (tiny-llada-long) and 39.6%
# (tiny-dream-long) after hours of batch-8 stages (benchmarks/long-count.sh, long-keys-dream.sh); here
# each continues from its shipped weights at full length with BATCH (default 64) examples per step,
# bf16 autocast, for SECS seconds: tiny-llada-long on the last CPU stage's mixture (cc-9),
# tiny-dream-long on it plus the narrow-key lookups (the step it never kept on the CPU). Then the
# long suite (8 test examples per size) and an export of the run's last checkpoint (float32) under
# $O/embedded/<name>: copy it into dllm/models/embedded/ only if it beats the shipped model, then re-run
# tests/models/test_embedded_trained.py, choose_cache and e2e. Check on a CPU with DEV=cpu BF16=0 SECS=10.
set -uo pipefail
O=${OUT:-benchmarks/gpu-train-long-$(date +%F)}
DEV=${DEV:-cuda}
SECS=${SECS:-150}
BATCH=${BATCH:-64}
STEPS=${STEPS:-3000}  # the cosine horizon; SECS stops the run earlier if it is slower than that
mkdir -p "$O/embedded"
unset TRITON_INTERPRET
FULL="count_c16:1:16:2040 count_c8:0.25:8:2040 lookup_long:0.5:4:339 lookup_any:0.25:4:339 span_copy_far:0.5:16:2039"
declare -A MIX=([tiny-llada-long]="$FULL" [tiny-dream-long]="$FULL lookup_k1:0.25:4:16 lookup_k2:0.25:4:48")
for m in tiny-llada-long tiny-dream-long; do
  run=runs/gpu-$m
  rm -rf "$run"
  # shellcheck disable=SC2086
  DEVICE=$DEV BF16=${BF16:-1} TIME_LIMIT=$SECS THREADS=${THREADS:-8} python benchmarks/key_curriculum.py stage \
    "$m" "$run" "$STEPS" 3e-4 "$BATCH" ${MIX[$m]} > "$O/train-$m.log" 2>&1
  cp "$run/log.jsonl" "$O/log-$m.jsonl"
  ck=$(ls -d "$run"/checkpoint-* 2>/dev/null | tail -1)
  if [ -z "$ck" ]; then echo "$m: no checkpoint (see $O/train-$m.log)" > "$O/eval-$m.txt"; continue; fi
  timeout 150 dllm eval-tasks --model "$ck" --tasks lookup_long lookup_any span_copy_far count_long --per-size "${PER_SIZE:-8}" \
    --device "$DEV" --json "$O/eval-$m.json" > "$O/eval-$m.txt" 2>&1
  python -m dllm.train.export --run "$run" --name "$m" --checkpoint "$(basename "$ck")" --dtype float32 \
    --note "continued on a GPU by benchmarks/gpu-train-long.sh ($SECS s, batch $BATCH, $(basename "$ck"))" \
    > "$O/export-$m.txt" 2>&1
  cp -r "dllm/models/embedded/$m" "$O/embedded/"
  git checkout -q -- "dllm/models/embedded/$m" 2>/dev/null || true  # the checkout keeps the shipped model
done
tail -n 8 "$O"/eval-*.txt

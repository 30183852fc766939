#!/usr/bin/env bash
# tiny-dream-long, the count at RoPE base 10^6 (2026-12-02, session 10): long-rope-dream.sh's result counts
# 12.5% on the suite (lookups 93.8%, span 100%). Here tiny-llada-long's count curriculum at the new base
# (benchmarks/long-rope.sh rt-2..rt-6: short lists first, then doubling the length, lookups and the span copy
# mixed in at full length) is applied to it. One `python benchmarks/key_curriculum.py stage ...` per stage
# (a stage's checkpoint carries the base on: key_curriculum.stage_model). Notes:
# benchmarks/training-notes-2026-12-01.md. INIT: rd-L3 step 300 (long-rope-dream.sh), which is what the
# embedded tiny-dream-long held before this chain, e.g. `mkdir -p runs/initd4 && git archive a471c67
# dllm/models/embedded/tiny-dream-long | tar -x -C runs/initd4`.
# FROM=k: start at stage k (the earlier ones' checkpoints in place).
set -euo pipefail
S="python benchmarks/key_curriculum.py stage"
FROM=${FROM:-1}
run() { local k=$1; shift; if [ "$k" -ge "$FROM" ]; then "$@"; fi; }
P=${P:-runs/rdc-}
INIT=${INIT:?set INIT to tiny-dream-long before this chain (see above)}
export THREADS=${THREADS:-2}
# the full-length mixture of stages 5-9 (lists up to 2,040 items), lookup_long at weight $1
full() { echo "count_c16:1:16:2040 count_c8:0.25:8:1024 lookup_long:$1:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039"; }
# the count on short lists (one thread, 10 min): count 100 / 81.2% at 12 / 32 items (count_c4 / count_c8),
# count_long 56.2% at 28, 0% at 124; lookup_long 93.8% at 170 rows (N=16)
run 1 $S $INIT ${P}1 400 1e-3 32 count_c4:1:4:12 count_c8:1:8:32 lookup_long:0.15:4:339 span_copy_far:0.1:16:2039
# <= 128 items (from here two threads; stages 2-5 took 8, 14, 7, 8 min): count_long 75.0 / 37.5% at 60 / 124
# items; lookup_long 81.2% at 339 rows
run 2 $S ${P}1/checkpoint-0000400 ${P}2 400 8e-4 16 count_c16:1:16:128 count_c8:0.5:8:64 lookup_long:0.3:4:339 \
    lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# <= 256 items: count_long 43.8 / 31.2% at 124 / 251; lookup_long 93.8% at 339 rows
run 3 $S ${P}2/checkpoint-0000400 ${P}3 600 6e-4 16 count_c16:1:16:256 count_c8:0.25:8:128 \
    lookup_long:0.3:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# <= 1,024 items: the suite with --per-size 16 (below): C = 0 mean 75.0% (count 34.4, lookup 92.2, span 98.4)
run 4 $S ${P}3/checkpoint-0000600 ${P}4 400 5e-4 8 count_c16:1:16:1024 count_c8:0.25:8:256 \
    lookup_long:0.3:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# <= 2,040 items: `dllm eval-tasks --model runs/rdc-5/checkpoint-0000300 --tasks lookup_long lookup_any
# span_copy_far count_long --per-size 16 --threads 2`: C = 0 mean 78.1% (count 43.8, lookup 92.2, span 98.4;
# before the chain 68.8%: count 12.5)
run 5 $S ${P}4/checkpoint-0000400 ${P}5 300 5e-4 8 $(full 0.3)
# the same at lr 3e-4, 500 steps (one thread, beside tiny-llada-long's rt-8, 28 min): --per-size 16 C = 0 mean 81.2%
# (count 45.3, lookup 100, span 98.4; benchmarks/eval-tasks-count-dream-rdc-6-per16-2026-12-02.json). Shipped in session 10:
#   python -m dllm.train.export --run ${P}6 --name tiny-dream-long --checkpoint checkpoint-0000500 --dtype float32
run 6 $S ${P}5/checkpoint-0000300 ${P}6 500 3e-4 8 $(full 0.3)
# the same at lr 2e-4, 900 steps (2026-12-03, session 11; one thread beside tiny-llada-long's rt-9, 37 min; run
# from the exported rdc-6, the same float32 weights): --per-size 16 C = 0 mean 85.4% (count 64.1, lookup 92.2,
# span 100; benchmarks/eval-tasks-count-dream-rdc-7-per16-2026-12-03.json)
run 7 $S ${P}6/checkpoint-0000500 ${P}7 900 2e-4 8 $(full 0.3)
# the same at two threads (session 11, 24 min): --per-size 16 94.8% (count 84.4, lookup 100, span 100),
# --per-size 32 89.3% (count 75.0, lookup 93.0)
run 8 $S ${P}7/checkpoint-0000900 ${P}8 1000 2e-4 8 $(full 0.3)
# lookups at 0.4, lr 1.5e-4 (two threads, 25 min): --per-size 32 92.4% (count 83.6, lookup 93.8, span 100;
# picked over rdc-8 by this number), --per-size 4 95.8%. Shipped:
#   python -m dllm.train.export --run ${P}9 --name tiny-dream-long --checkpoint checkpoint-0001000 --dtype float32
run 9 $S ${P}8/checkpoint-0001000 ${P}9 1000 1.5e-4 8 $(full 0.4)

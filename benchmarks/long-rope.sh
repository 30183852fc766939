#!/usr/bin/env bash
# tiny-llada-long, fourth training (2026-12-02, session 9): a larger RoPE base. The shipped model's
# lookups faded with length (100 / 81 / 62 / 19% at 256 / 512 / 1,024 / 2,040 words) however long it
# trained at full length. With head dim 32 and base 10^4 only ~2 of the 16 rotary frequencies stay
# below one radian over 2,048 positions, so few dimensions can match content at any distance; base
# 10^6 (Code Llama's long-context recipe) leaves ~7. One stage of cc-9's own mixture with
# ROPE_THETA=1e6 takes lookup_long at 2,040 words from 18.8% to 93.8% and loses the count (0%, even
# on 32 items), which then re-forms a doubling at a time as before, the lookups mixed in at full
# length. One `python benchmarks/key_curriculum.py stage ...` per stage, two threads (a stage's
# checkpoint carries the base on: key_curriculum.stage_model). Notes: benchmarks/training-notes-2026-12-01.md.
# INIT: the model the chain starts from, the third tiny-llada-long at base 10^4 (the embedded name now loads
# this chain's result): e.g. `mkdir -p runs/init3 && git archive 215d277 dllm/models/embedded/tiny-llada-long |
# tar -x -C runs/init3` and INIT=runs/init3/dllm/models/embedded/tiny-llada-long.
set -euo pipefail
S="python benchmarks/key_curriculum.py stage"
P=${P:-runs/rt-}
INIT=${INIT:?set INIT to the third tiny-llada-long (see above)}
export THREADS=${THREADS:-2}
# cc-9's mixture at base 10^6 (17 min): lookup_long 100%, span 100%, count 0%
ROPE_THETA=1e6 $S $INIT ${P}1 600 5e-4 8 count_c16:1:16:2040 count_c8:0.25:8:2040 \
    lookup_long:0.5:4:339 lookup_any:0.25:4:339 span_copy_far:0.5:16:2039
# the count on short lists again (5 min): 100% at 12 items, 87.5% at 32; lookup_long 75% at 339 rows
$S ${P}1/checkpoint-0000600 ${P}2 400 1e-3 32 count_c4:1:4:12 count_c8:1:8:32 lookup_long:0.15:4:339 \
    span_copy_far:0.1:16:2039
# <= 128 items
$S ${P}2/checkpoint-0000400 ${P}3 400 8e-4 16 count_c16:1:16:128 count_c8:0.5:8:64 lookup_long:0.3:4:339 \
    lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# <= 256 items (one thread beside the Dream run, 19 min): count 56.2% at 128, 37.5% at 251; lookup_long 100% at 339
THREADS=1 $S ${P}3/checkpoint-0000400 ${P}4 600 6e-4 16 count_c16:1:16:256 count_c8:0.25:8:128 \
    lookup_long:0.3:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# <= 1,024 items (one thread, 9 min): count 56.2 / 62.5 / 56.2% at 251 / 507 / 1,019; lookup_long 75% at 339
THREADS=1 $S ${P}4/checkpoint-0000600 ${P}5 400 5e-4 8 count_c16:1:16:1024 count_c8:0.25:8:256 \
    lookup_long:0.3:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# <= 2,040 items (one thread, 14 min): count 68.8 / 68.8 / 75.0% at 251 / 1,019 / 2,035, lookup_long 93.8 / 75.0%
# at 170 / 339 rows (N=16); the suite (`dllm eval-tasks --model runs/rt-6/checkpoint-0000300 --tasks lookup_long
# lookup_any span_copy_far count_long --per-size 4 --threads 1`): C = 0 mean 93.8% (count 87.5, lookup 93.8,
# span 100); with --per-size 16 (64 per task): 86.5% (count 71.9, lookup 87.5, span 100)
THREADS=1 $S ${P}5/checkpoint-0000400 ${P}6 300 5e-4 8 count_c16:1:16:2040 count_c8:0.25:8:1024 \
    lookup_long:0.3:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# cc-9's mixture again at lr 3e-4 (one thread): --per-size 16 C = 0 mean 85.9% (count 64.1, lookup 93.8), a tie
# with rt-6's 86.5%; not shipped
THREADS=1 $S ${P}6/checkpoint-0000300 ${P}7 400 3e-4 8 count_c16:1:16:2040 count_c8:0.25:8:2040 \
    lookup_long:0.5:4:339 lookup_any:0.25:4:339 span_copy_far:0.5:16:2039
# shipped as tiny-llada-long in session 9:
#   python -m dllm.train.export --run ${P}6 --name tiny-llada-long --checkpoint checkpoint-0000300 --dtype float32
# rt-6's mixture with the lookups at 0.5, 500 steps at lr 2e-4 (2026-12-02, session 10; one thread beside the
# Dream count chain, 29 min; run from the exported rt-6, the same float32 weights): --per-size 16 C = 0 mean 90.6%
# (count 76.6, lookup 95.3, span 100; benchmarks/eval-tasks-rope-rt8-per16-2026-12-02.json). Shipped:
#   python -m dllm.train.export --run ${P}8 --name tiny-llada-long --checkpoint checkpoint-0000500 --dtype float32
THREADS=1 $S ${P}6/checkpoint-0000300 ${P}8 500 2e-4 8 count_c16:1:16:2040 count_c8:0.25:8:1024 \
    lookup_long:0.5:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039
# the same mixture once more, 600 steps at lr 1e-4 (2026-12-03, session 11; one thread beside the Dream chain's
# rdc-7, ~37 min; run from the exported rt-8, the same float32 weights): --per-size 16 C = 0 mean 93.2% (count
# 87.5, lookup 92.2, span 100), --per-size 32 90.9% (count 81.2, lookup 91.4), i.e. 88.5% on instances 16-31
# (rt-8 there: 88.5%); --per-size 4 97.9%. The only checkpoint evaluated (no pick). Shipped:
#   python -m dllm.train.export --run ${P}9 --name tiny-llada-long --checkpoint checkpoint-0000600 --dtype float32
THREADS=1 $S ${P}8/checkpoint-0000500 ${P}9 600 1e-4 8 count_c16:1:16:2040 count_c8:0.25:8:1024 \
    lookup_long:0.5:4:339 lookup_any:0.1:4:339 span_copy_far:0.15:16:2039

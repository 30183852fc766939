#!/usr/bin/env bash
# tiny-dream-long, fourth try (2026-12-02, session 9): the key-width curriculum of
# benchmarks/long-keys-dream.sh (kd2's stages, the span copy mixed in) at RoPE base 10^6 from the
# start (why: benchmarks/long-rope.sh), then two length stages. Every earlier Dream copy lost its
# lookups as soon as tables grew past the rows of its key stages (0% at 85 rows); at base 10^6 the
# key stages alone (<= 42 rows) already give 62.5% at 85 rows. One `python benchmarks/key_curriculum.py
# stage ...` per stage, one thread each (beside the tiny-llada-long run). Notes:
# benchmarks/training-notes-2026-12-01.md.
# INIT: the model the chain starts from, tiny-dream-long before it (the first training, base 10^4; the embedded
# name now loads this chain's result): e.g. `mkdir -p runs/initd && git archive 215d277
# dllm/models/embedded/tiny-dream-long | tar -x -C runs/initd` and INIT=runs/initd/dllm/models/embedded/tiny-dream-long.
set -euo pipefail
S="python benchmarks/key_curriculum.py stage"
P=${P:-runs/rd-}
INIT=${INIT:?set INIT to tiny-dream-long before this chain (see above)}
export THREADS=${THREADS:-1}
# one-item keys: at chance until ~1,500 steps, solved by ~1,900 (the base-10^4 tries: ~2,050)
ROPE_THETA=1e6 STOP_AT=2000 $S $INIT ${P}k1 3000 1e-3 64 lookup_k1:1:4:8 span_copy_far:0.25:16:64
STOP_AT=400 $S ${P}k1/checkpoint-0002000 ${P}k2 1000 1e-3 64 lookup_k2:1:4:16 lookup_k1:0.25:4:16 \
    span_copy_far:0.25:16:64
# N=16: lookup_k1 100% at 8 rows, lookup_k2 87.5% at 16, lookup_long 100% at 16, span 87.5% at 252 items
STOP_AT=400 $S ${P}k2/checkpoint-0000400 ${P}k3 1000 1e-3 64 lookup_long:1:4:16 lookup_k2:0.25:4:16 \
    count_long:0.5:24:95 span_copy_far:0.25:16:96
# <= 42 rows (N=8): lookup_long 100 / 62.5% at 42 / 85 rows, span 100% at 252, count 50% at 32 items
$S ${P}k3/checkpoint-0000400 ${P}k4 600 6e-4 32 lookup_long:1:4:42 lookup_k2:0.25:4:32 span_copy_far:0.25:16:256 \
    count_c4:0.25:4:12 count_c8:0.25:8:64
# <= 172 rows (N=8): lookup_long 75.0 / 62.5 / 0% at 85 / 170 / 339 rows, span 100% at 1,020, count 0% at 251
$S ${P}k4/checkpoint-0000600 ${P}L1 400 5e-4 16 lookup_long:1:4:172 lookup_any:0.25:4:172 span_copy_far:0.3:16:1036 \
    count_c8:0.25:8:128 count_c16:0.5:16:512
# full length: the suite's C = 0 mean 66.7% (lookup 87.5, span 100, count 12.5), 66.7% with --per-size 16
$S ${P}L1/checkpoint-0000400 ${P}L2 300 5e-4 8 lookup_long:1:4:339 lookup_any:0.25:4:339 span_copy_far:0.3:16:2039 \
    count_c16:0.5:16:2040 count_c8:0.25:8:512
# the same at lr 3e-4: 68.8% (lookup 93.8, span 100, count 12.5), 68.8% with --per-size 16; shipped as tiny-dream-long:
#   python -m dllm.train.export --run ${P}L3 --name tiny-dream-long --checkpoint checkpoint-0000300 --dtype float32
$S ${P}L2/checkpoint-0000300 ${P}L3 300 3e-4 8 lookup_long:1:4:339 lookup_any:0.25:4:339 span_copy_far:0.3:16:2039 \
    count_c16:0.5:16:2040 count_c8:0.25:8:512

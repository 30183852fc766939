#!/usr/bin/env bash
# tiny-dream-long, second training (2026-12-02): the key-width curriculum of benchmarks/long-keys.sh
# (one `python benchmarks/key_curriculum.py stage ...` per stage), as run for the Dream model.
# The one-item-key stage needed longer than LLaDA's (at chance for ~2,050 steps in all, then the loss fell
# 0.95 -> 0.01 within ~250 steps), hence a third k1 stage. Notes: benchmarks/training-notes-2026-12-01.md.
set -euo pipefail
S="python benchmarks/key_curriculum.py stage"
P=${P:-runs/kd-}
# 1. one-item keys, 4-8 rows (k1a, k1b: flat at chance; k1c: the click, stopped by hand at 1,200 steps)
$S tiny-dream-long ${P}k1a 600 1e-3 64 lookup_k1:1:4:8
STOP_AT=600 $S ${P}k1a/checkpoint-0000600 ${P}k1b 2000 1e-3 64 lookup_k1:1:4:8
STOP_AT=1200 $S ${P}k1b/checkpoint-0000600 ${P}k1c 3000 1e-3 64 lookup_k1:1:4:8
# 2. two-item keys, then the suite's keys (as benchmarks/long-keys.sh)
STOP_AT=400 $S ${P}k1c/checkpoint-0001200 ${P}k2 1000 1e-3 64 lookup_k2:1:4:16 lookup_k1:0.25:4:16
STOP_AT=400 $S ${P}k2/checkpoint-0000400 ${P}k3 1000 1e-3 64 lookup_long:1:4:16 lookup_k2:0.25:4:16 \
    count_long:0.5:24:95 span_copy_far:0.25:16:96

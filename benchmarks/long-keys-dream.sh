#!/usr/bin/env bash
# tiny-dream-long, second training (2026-12-02): the key-width curriculum of benchmarks/long-keys.sh
# (one `python benchmarks/key_curriculum.py stage ...` per stage), as run for the Dream model.
# The one-item-key stage needed longer than LLaDA's (at chance for ~2,050 steps in all, then the loss fell
# 0.95 -> 0.01 within ~250 steps), hence a third k1 stage. Notes: benchmarks/training-notes-2026-12-01.md.
set -euo pipefail
S="python benchmarks/key_curriculum.py stage"
. "$(dirname "$0")/length-mixes.sh"  # LEN1 .. LEN4
P=${P:-runs/kd-}
# 1. one-item keys, 4-8 rows (k1a, k1b: flat at chance; k1c: the click, stopped by hand at 1,200 steps)
$S tiny-dream-long ${P}k1a 600 1e-3 64 lookup_k1:1:4:8
STOP_AT=600 $S ${P}k1a/checkpoint-0000600 ${P}k1b 2000 1e-3 64 lookup_k1:1:4:8
STOP_AT=1200 $S ${P}k1b/checkpoint-0000600 ${P}k1c 3000 1e-3 64 lookup_k1:1:4:8
# 2. two-item keys, then the suite's keys (as benchmarks/long-keys.sh)
STOP_AT=400 $S ${P}k1c/checkpoint-0001200 ${P}k2 1000 1e-3 64 lookup_k2:1:4:16 lookup_k1:0.25:4:16
STOP_AT=400 $S ${P}k2/checkpoint-0000400 ${P}k3 1000 1e-3 64 lookup_long:1:4:16 lookup_k2:0.25:4:16 \
    count_long:0.5:24:95 span_copy_far:0.25:16:96
# 3. the length curriculum of benchmarks/long-keys.sh (one thread here, beside another run); L2 was
#    stopped at step 200: the span copy was gone (0% at 64-252 items, shipped 100%) and did not return
$S ${P}k3/checkpoint-0000400 ${P}L1 500 6e-4 32 $LEN1
STOP_AT=200 $S ${P}L1/checkpoint-0000500 ${P}L2 400 6e-4 16 $LEN2
# 4. the span copy at short lists (stopped at step ~450, loss flat at ~1.5; not shipped)
STOP_AT=400 $S ${P}L2/checkpoint-0000200 ${P}s1 600 8e-4 32 span_copy_far:1:16:128 lookup_long:0.5:4:42 \
    lookup_any:0.25:4:42

# ---- second try (kd2): the span copy kept in every stage, from the shipped tiny-dream-long
P2=${P2:-runs/kd2-}
# one-item keys with the span copy at a quarter (the loss left ~0.8 at ~1,500 steps, 0.012 at 1,910;
# stopped by hand at 2,000)
STOP_AT=2000 $S tiny-dream-long ${P2}k1 3000 1e-3 64 lookup_k1:1:4:8 span_copy_far:0.25:16:64
STOP_AT=400 $S ${P2}k1/checkpoint-0002000 ${P2}k2 1000 1e-3 64 lookup_k2:1:4:16 lookup_k1:0.25:4:16 \
    span_copy_far:0.25:16:64
STOP_AT=400 $S ${P2}k2/checkpoint-0000400 ${P2}k3 1000 1e-3 64 lookup_long:1:4:16 lookup_k2:0.25:4:16 \
    count_long:0.5:24:95 span_copy_far:0.25:16:96
$S ${P2}k3/checkpoint-0000400 ${P2}L1 500 6e-4 32 $LEN1
# stopped at step 200 for the session's end
STOP_AT=200 $S ${P2}L1/checkpoint-0000500 ${P2}L2 400 6e-4 16 $LEN2
# (2026-12-02) L2 again from its step 200 (L2b), then L3-L5 as in benchmarks/long-keys.sh (two threads,
# ~47 min; L6 stopped at its start for the session's end). After L5 the lookups were GONE (lookup_long
# 0% on the suite, 12.5% at 16 rows, N=8), the span copy 100%: C = 0 mean 35.4% (shipped 39.6%),
# benchmarks/eval-tasks-dream-kd2-L5-2026-12-02.json. Not shipped.
export THREADS=2
$S ${P2}L2/checkpoint-0000200 ${P2}L2b 200 6e-4 16 $LEN2
$S ${P2}L2b/checkpoint-0000200 ${P2}L3 300 6e-4 8 $LEN3
$S ${P2}L3/checkpoint-0000300 ${P2}L4 250 6e-4 4 $LEN4
$S ${P2}L4/checkpoint-0000250 ${P2}L5 400 5e-4 8 $LEN4

# ---- third try (kd3, 2026-12-02, session 6): longer key stages at 16-42 rows before the length stages,
# from kd2-L1 (after L1: lookup_long 100 / 62.5 / 37.5% at 8 / 16 / 42 rows, N=8)
export THREADS=1
P3=${P3:-runs/kd3-}
$S ${P2}L1/checkpoint-0000500 ${P3}k 800 6e-4 32 lookup_long:1:4:42 lookup_k2:0.25:4:32 \
    span_copy_far:0.25:16:256 count_long:0.25:24:255
$S ${P3}k/checkpoint-0000800 ${P3}k2 1200 5e-4 32 lookup_long:1:8:42 lookup_k2:0.25:4:32 \
    span_copy_far:0.2:16:256 count_long:0.1:24:255
# length stages with the lookups weighted 1.5 and lr 4e-4 (two threads, 6 / 7 / 17 min). After L4
# (`dllm eval-tasks --model runs/kd3-L4/checkpoint-0000300 --tasks lookup_long lookup_any span_copy_far
# count_long --per-size 4 --threads 2`, benchmarks/eval-tasks-dream-kd3-L4-2026-12-02.json): span 100%,
# lookup_long 0%, lookup_any 50.0%, count_long 12.5%: C = 0 mean 37.5% (shipped 39.6%). After L3: C = 0
# mean 31.2% (lookup_long 12.5%, span 75%, same command, one thread). Not shipped.
export THREADS=2
KD3_LEN2="lookup_long:1.5:8:85 lookup_any:0.25:4:85 span_copy_far:0.5:16:516 count_long:0.25:24:515"
$S ${P3}k2/checkpoint-0001200 ${P3}L2 400 4e-4 16 $KD3_LEN2
$S ${P3}L2/checkpoint-0000400 ${P3}L3 300 4e-4 8 lookup_long:1.5:8:172 lookup_any:0.25:4:172 \
    span_copy_far:0.5:16:1036 count_long:0.25:24:1035
$S ${P3}L3/checkpoint-0000300 ${P3}L4 300 4e-4 8 lookup_long:1.5:8:339 lookup_any:0.25:4:339 \
    span_copy_far:0.5:16:2039 count_long:0.25:24:2040

# ---- (2026-12-02, session 7) one long length stage at <= 85 rows from kd3-k2, 3x kd3-L2's steps
# (one thread, 34 min). `N=8 THREADS=2 python benchmarks/key_curriculum.py eval runs/kd3-L2x/checkpoint-0001200
# lookup_long:16 lookup_long:42 lookup_long:85 span_copy_far:252 count_long:63`: 100 / 62.5 / 25.0% at
# 16 / 42 / 85 rows, span 100%, count 25.0%. lookup_long at 42 / 85 rows after 200 / 400 / 600 / 800 / 1000
# steps (N=8): 25/0, 25/0, 62.5/0, 37.5/0, 50/0. Not continued, not shipped.
export THREADS=1
$S ${P3}k2/checkpoint-0001200 ${P3}L2x 1200 4e-4 16 $KD3_LEN2   # kd3-L2's mixture

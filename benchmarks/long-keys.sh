#!/usr/bin/env bash
# tiny-llada-long, second training (2026-12-01, session 3): the key-width curriculum, then the length
# curriculum again. Every stage is one `python benchmarks/key_curriculum.py stage INIT OUT STEPS LR
# BATCH TASK:WEIGHT:LO:HI ...` (a fresh AdamW per stage, warm-up 50, cosine to 10%, seed 0).
# The first stage starts from the tiny-llada-long shipped before it (`python -m dllm.train --recipe
# tiny-llada-long`, exported at step 3,550). Notes and numbers: benchmarks/training-notes-2026-12-01.md.
# The same chain for the other long model: MODEL=tiny-dream-long P=runs/kd- bash benchmarks/long-keys.sh
set -euo pipefail
MODEL=${MODEL:-tiny-llada-long}
P=${P:-runs/kc-}
S="python benchmarks/key_curriculum.py stage"
. "$(dirname "$0")/length-mixes.sh"  # LEN1 .. LEN4
# 1. one-item keys (16 keys), 4-8 rows: the match-and-copy step forms (at chance for ~850 steps, then
#    the loss falls from 0.8 to 0.005 within ~250 steps)
#    (STOP_AT: the stages below were stopped by hand once they had learned; the schedule spans STEPS)
$S "$MODEL" ${P}k1a 600 1e-3 64 lookup_k1:1:4:8
STOP_AT=600 $S ${P}k1a/checkpoint-0000600 ${P}k1b 2000 1e-3 64 lookup_k1:1:4:8
# 2. two-item keys, 4-16 rows (1-item keys kept at a quarter)
STOP_AT=400 $S ${P}k1b/checkpoint-0000600 ${P}k2 1000 1e-3 64 lookup_k2:1:4:16 lookup_k1:0.25:4:16
# 3. the suite's three-item keys, 4-16 rows, with the count and the span copy at their short sizes
STOP_AT=400 $S ${P}k2/checkpoint-0000400 ${P}k3 1000 1e-3 64 lookup_long:1:4:16 lookup_k2:0.25:4:16 \
    count_long:0.5:24:95 span_copy_far:0.25:16:96
# 4. the length curriculum: prompts of <= 260 / 520 / 1,040 / 2,048 words, the batch halved each time
export THREADS=2
$S ${P}k3/checkpoint-0000400 ${P}L1 500 6e-4 32 $LEN1
$S ${P}L1/checkpoint-0000500 ${P}L2 400 6e-4 16 $LEN2
$S ${P}L2/checkpoint-0000400 ${P}L3 300 6e-4 8 $LEN3
$S ${P}L3/checkpoint-0000300 ${P}L4 250 6e-4 4 $LEN4
# 5. more steps at the full length (batch 8)
$S ${P}L4/checkpoint-0000250 ${P}L5 400 5e-4 8 $LEN4
$S ${P}L5/checkpoint-0000400 ${P}L6 300 3e-4 8 $LEN4

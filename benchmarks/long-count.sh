#!/usr/bin/env bash
# tiny-llada-long, third training (2026-12-02): counting. Every earlier stage trained count_long on
# lists of >= 24 items and the count never left chance; on lists of 4-12 items (1-4 occurrences) it
# forms within ~500 steps, and then extends to longer lists and larger counts a doubling at a time
# (it does not extrapolate: trained on <= 32 items, 94% at 32 and 6% at 48). The lookups and the span
# copy are mixed in from the second stage on (the first, count alone, forgot the lookups: 87.5 ->
# 6.2% at 42 rows). One `python benchmarks/key_curriculum.py stage ...` per stage (one thread, beside
# the tiny-dream-long run). Notes: benchmarks/training-notes-2026-12-01.md.
set -euo pipefail
S="python benchmarks/key_curriculum.py stage"
P=${P:-runs/cc-}
$S tiny-llada-long ${P}1 800 1e-3 64 count_c4:1:4:12
$S ${P}1/checkpoint-0000800 ${P}2 1000 1e-3 64 count_c4:0.5:4:32 count_c8:1:8:32 lookup_long:1:4:16 \
    lookup_k2:0.25:4:16 span_copy_far:0.25:16:64
$S ${P}2/checkpoint-0001000 ${P}3 800 1e-3 48 count_c16:1:16:64 count_c8:0.5:8:64 lookup_long:0.5:4:24 \
    lookup_any:0.25:4:24 span_copy_far:0.25:16:128
$S ${P}3/checkpoint-0000800 ${P}4 800 8e-4 32 count_c16:1:16:128 count_c8:0.25:8:128 lookup_long:0.5:4:42 \
    lookup_any:0.25:4:42 span_copy_far:0.25:16:256
# (two threads from here on)
THREADS=2 $S ${P}4/checkpoint-0000800 ${P}5 600 6e-4 16 count_c16:1:16:256 count_c8:0.25:8:256 \
    lookup_long:0.5:4:85 lookup_any:0.25:4:85 span_copy_far:0.25:16:516
# one jump to the full lengths: the count is lost again (see the notes)
THREADS=2 $S ${P}5/checkpoint-0000600 ${P}7 250 4e-4 8 count_c16:1:16:2040 lookup_long:1:4:339 \
    lookup_any:0.25:4:339 span_copy_far:0.5:16:2039
# the doubling instead (one thread): C = 0 mean 60.4% on the suite, the best so far, not shipped
THREADS=1 $S ${P}5/checkpoint-0000600 ${P}6 500 5e-4 8 count_c16:1:16:512 count_c8:0.25:8:512 \
    lookup_long:0.5:4:170 lookup_any:0.25:4:170 span_copy_far:0.25:16:1036
# <= 1,024 items, lookups and the span copy at full length again (two threads, 14 min): C = 0 mean 60.4%
THREADS=2 $S ${P}6/checkpoint-0000500 ${P}8 300 5e-4 8 count_c16:1:16:1024 count_c8:0.25:8:1024 \
    lookup_long:0.5:4:339 lookup_any:0.25:4:339 span_copy_far:0.5:16:2039
# <= 2,040 items (two threads, 22 min): C = 0 mean 66.7%; shipped as tiny-llada-long (2026-12-02) with
#   python -m dllm.train.export --run ${P}9 --name tiny-llada-long --checkpoint checkpoint-0000400 --dtype float32
THREADS=2 $S ${P}8/checkpoint-0000300 ${P}9 400 5e-4 8 count_c16:1:16:2040 count_c8:0.25:8:2040 \
    lookup_long:0.5:4:339 lookup_any:0.25:4:339 span_copy_far:0.5:16:2039
# (not shipped) the count weighted up at full length plus shorter lists, lr 3e-4 (two threads, 20 min):
# count_long 12.5%, lookup_long 56.2%: C = 0 mean 56.2%, worse than cc-9 (benchmarks/eval-tasks-count-cc10-2026-12-02.json)
THREADS=2 $S ${P}9/checkpoint-0000400 ${P}10 300 3e-4 8 count_c16:1.5:16:2040 count_c8:0.5:8:512 \
    lookup_long:0.5:4:339 lookup_any:0.25:4:339 span_copy_far:0.25:16:2039
# (2026-12-02, session 6; not shipped) cc-9's own mixture for 600 more steps at lr 3e-4 (two threads, beside
# another run, 80 min): lookup_long 75.0%, count_long 12.5%, span 100%, lookup_any 56.2%: C = 0 mean 62.5%
# (`dllm eval-tasks --model runs/cc-11/checkpoint-0000600 --tasks lookup_long lookup_any span_copy_far
# count_long --per-size 4 --threads 2`, benchmarks/eval-tasks-count-cc11-2026-12-02.json)
THREADS=2 $S ${P}9/checkpoint-0000400 ${P}11 600 3e-4 8 count_c16:1:16:2040 count_c8:0.25:8:2040 \
    lookup_long:0.5:4:339 lookup_any:0.25:4:339 span_copy_far:0.5:16:2039

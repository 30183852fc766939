#!/usr/bin/env bash
# The serving issue's GPU numbers, for a session lent a GPU after benchmarks/gpu-check.sh (`run` tool;
# install first: pip install --no-deps --no-build-isolation -e .): `dllm bench serve` on tiny-llada on
# the GPU, continuous against static and one-at-a-time serving, one setting and mixed settings,
# interleaved. The device machine has aiohttp and prometheus-client but not FastAPI, uvicorn or
# greenlet, and reaches no registry: download their wheels here into .wheels/serve (git-ignored) and
# name .wheels in the run's carry; this script installs them from there:
#   pip download fastapi uvicorn greenlet --python-version 3.12 --only-binary=:all: --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d .wheels/serve
# Then the engine-only tables (benchmarks/serve_engine.py: no HTTP; tiny-random-llada, its --null-model,
# tiny-llada, and tiny-llada with --call-cost-tokens auto: the call cost measured on the GPU, as
# dllm serve (and so dllm bench serve above) does by default; the table prints it): requests/s, the
# forwards' share of wall time, scheduler us per running row per step.
# The goal on a GPU: continuous >= 1.0x static at inf and <= 0.7x its p99 at 80% load.
# Writes 6 files under ${OUT:-benchmarks/gpu-serve-$(date +%F)} (the device brings back at most 8): gpu.txt,
# log.txt (every step's output: the wheels, the imports, each table), and serve/ and serve-mixed/ (each a
# JSON and a plot); the steps' timeouts sum to 4.5 minutes.
# DEVICE=cpu N=16 REPEATS=1 bash benchmarks/gpu-serve.sh runs the same steps on a CPU (a smoke test; CI).
O=${OUT:-benchmarks/gpu-serve-$(date +%F)}
N=${N:-128}
REPEATS=${REPEATS:-2}
. "$(dirname "$0")/lib-gpu.sh"
if [ -d .wheels/serve ]; then
  python3 -m pip install -q --no-index --find-links .wheels/serve fastapi uvicorn greenlet >> "$O/log.txt" 2>&1
fi
if ! python3 -c "import fastapi, uvicorn, prometheus_client, greenlet, aiohttp" >> "$O/log.txt" 2>&1; then
  echo "FastAPI, uvicorn, prometheus-client, greenlet or aiohttp is missing (see the header):"; cat "$O/log.txt"
  exit 1
fi
step 90 log.txt dllm bench serve --model tiny-llada --device "$DEVICE" --n "$N" --rates 32 inf \
  --modes continuous static serial --repeats "$REPEATS" --no-progress --out "$O/serve"
step 60 log.txt dllm bench serve --model tiny-llada --device "$DEVICE" --n "$N" --rates inf \
  --modes continuous static serial --settings low_confidence@none threshold@dual fast@none \
  --repeats "$REPEATS" --no-progress --out "$O/serve-mixed"
step 30 log.txt python3 benchmarks/serve_engine.py tiny-random-llada --device "$DEVICE" --n "$N" \
  --repeats "$REPEATS"
step 30 log.txt python3 benchmarks/serve_engine.py tiny-random-llada --null-model --device "$DEVICE" \
  --n "$N" --repeats "$REPEATS"
step 40 log.txt python3 benchmarks/serve_engine.py tiny-llada --device "$DEVICE" --n "$N" \
  --repeats "$REPEATS"
step 20 log.txt python3 benchmarks/serve_engine.py tiny-llada --device "$DEVICE" --n "$N" \
  --repeats "$REPEATS" --modes continuous static --call-cost-tokens auto
finish

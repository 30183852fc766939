# Sourced by benchmarks/gpu-*.sh: the output folder, the device, and `step` (one timed command whose
# output goes to a file and whose failure is recorded, so a script that rotted exits non-zero).
#   O=...  DEVICE=cuda|cpu (cpu: the same steps on tiny shapes, seconds; CI runs every script so)
set -uo pipefail
DEVICE=${DEVICE:-cuda}
mkdir -p "$O"
FAILED=0
if [ "$DEVICE" = cuda ]; then
  unset TRITON_INTERPRET
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$O/gpu.txt" 2>&1
else
  export TRITON_INTERPRET=1
fi
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$O/gpu.txt" 2>&1

# step SECONDS FILE COMMAND...: run COMMAND with a time limit, its output appended to $O/FILE. At the limit
# the command gets SIGTERM (dllm bench breakdown / e2e / serve then write what they finished, as on Ctrl-C),
# and SIGKILL 20 s later if it is still running
step() {
  local limit=$1 file=$2
  shift 2
  echo "\$ $*" >> "$O/$file"
  local start=$SECONDS
  timeout -k 20 "$limit" "$@" >> "$O/$file" 2>&1
  local rc=$?
  echo "# $((SECONDS - start)) s of $limit (exit $rc)" >> "$O/$file"
  if [ "$rc" -ne 0 ]; then
    echo "FAILED (exit $rc): $*" | tee -a "$O/gpu.txt"
    FAILED=1
  fi
}

finish() {
  tail -n 4 "$O"/*.txt
  exit "$FAILED"
}

#!/usr/bin/env bash
# Claims' GPU profiles (conf/claim/gpu/<slug>.yaml) on one GPU machine, many small runs at once, within a deadline;
# the run folders come back packed (no checkpoints) and the pages are rebuilt wherever they are unpacked:
#   make claim METHOD=<slug> PROFILE=gpu ARGS=--report-only      -> docs/results/gpu/<slug>.md
# Usage:
#   bash benchmarks/gpu_claims.sh [--bare] [--deadline-s 420] [--parallel N] [--pack FILE] [--mps on|off|auto] SLUG...
#   bash benchmarks/gpu_claims.sh [--bare] --pilot [--steps 150] [--copies 1] SLUG[:ENTRY]...   (step times only,
#   into logs/gpu_pilot or --out-root)
#   more options: --entries a,b --seeds 0,1 (a subset), --override KEY=VALUE (every run, repeatable), --out-root DIR
#   (default logs/claim/gpu), --cpu (no GPU: trainer=cpu, no CUDA check; a smoke test of this script)
# --bare: the machine's own python3 plus the wheels of `make gpu-wheels` (benchmarks/gpu_env.sh). --mps: CUDA's
# multi-process service lets the runs' small kernels share the GPU at once instead of taking turns (auto: use it when
# nvidia-cuda-mps-control is there and starts; the script stops it again at the end).
# Example (what produced docs/results/gpu/gated_deltanet.md):
#   BARE=1 bash benchmarks/gpu_claims.sh --bare --deadline-s 420 --pack logs/gpu_claims.tar.gz gated_deltanet
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=run MPS=auto CPU=0 ARGS=() SLUGS=() OVERRIDES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bare) BARE=1 ;;
    --pilot) MODE=pilot ;;
    --mps) MPS=$2; shift ;;
    --deadline-s|--parallel|--pack|--steps|--copies|--entries|--seeds|--out-root) ARGS+=("$1" "$2"); shift ;;
    --override) OVERRIDES+=("$2"); shift ;;
    --cpu) CPU=1 ;;
    --*) echo "error: unknown option $1" >&2; exit 2 ;;
    *) SLUGS+=("$1") ;;
  esac
  shift
done
[ ${#SLUGS[@]} -gt 0 ] || { echo "error: name at least one claim slug (conf/claim/gpu/<slug>.yaml)" >&2; exit 2; }
source benchmarks/gpu_env.sh
EXPS=()
for s in "${SLUGS[@]}"; do EXPS+=(--experiment "${s%%:*}" trainer=gpu); done
"$PY" benchmarks/gpu_preflight.py ${WHEEL_TARGET:+--target "$WHEEL_TARGET"} "${EXPS[@]}" $([ "$CPU" = 1 ] || echo --cuda)
[ "$CPU" = 1 ] && { MPS=off; OVERRIDES=(trainer=cpu "${OVERRIDES[@]}"); }

mps_stop() { echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true; }
if [ "$MPS" != off ] && command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=${TMPDIR:-/tmp}/suite-mps-pipe CUDA_MPS_LOG_DIRECTORY=${TMPDIR:-/tmp}/suite-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d && timeout 60 "$PY" -c 'import torch; assert torch.ones(2, device="cuda").sum() == 2'
  then
    echo "MPS: on"
    trap 'mps_stop; [ -n "$WHEEL_TARGET" ] && rm -rf "$WHEEL_TARGET"' EXIT
  else
    echo "MPS: did not start; the runs take turns on the GPU"
    mps_stop
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    [ "$MPS" = on ] && { echo "error: --mps on, but MPS did not start" >&2; exit 2; }
  fi
else
  echo "MPS: off"
fi
"$PY" benchmarks/gpu_claims.py "$MODE" "${SLUGS[@]}" "${ARGS[@]}" ${OVERRIDES[@]+--overrides "${OVERRIDES[@]}"}

#!/usr/bin/env bash
# GPU check, one short prepared script (about 2-3 min on one GPU, < 8 min by its timeouts); prints everything to
# record in an issue:
#   0. preflight (benchmarks/gpu_preflight.py): the imports, the wheels' origin, the configs the check runs compose
#      and instantiate on the CPU, then the CUDA device;
#   1. the GPU tests (fla's Triton gated-delta-rule kernel vs the suite's chunked path: outputs, final state and
#      gradients, T = 1024 and 4096);
#   2. the gated delta rule benchmark at T = 4096 on CUDA, fla's Triton kernel beside the suite's chunked path;
#   3. one epoch of one cheap paper-scale profile (sgm_lipschitz: embedded data, so no dataset is needed; entry ring,
#      seed 0), on the GPU, into logs/gpu_check/ (the results pages in docs/ are not touched).
# Usage:
#   bash benchmarks/gpu_check.sh               the suite's .venv (make install; pip install -e '.[gpu]' for fla)
#   bash benchmarks/gpu_check.sh --bare        a bare GPU machine: its own python3 (torch, lightning, torchmetrics,
#                                              timm, torch-geometric) plus the wheels of `make gpu-wheels` (.whl/,
#                                              carried with the tree), installed into a temporary target
#   bash benchmarks/gpu_check.sh --bare --preflight   only step 0, without CUDA: runs on any machine whose python3
#                                              (or PY=<python>) has torch, lightning, torchmetrics, timm and
#                                              torch-geometric, with the wheels of `make gpu-wheels` in .whl/
# Fails at once, with one line, on a machine without CUDA or without a wheel it needs; a failing step 1-3 does not
# stop the later ones (the script's exit code is 1 then).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFLIGHT_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --bare) BARE=1 ;;
    --preflight) PREFLIGHT_ONLY=1 ;;
    *) echo "error: unknown option $arg (valid: --bare --preflight)" >&2; exit 2 ;;
  esac
done
source benchmarks/gpu_env.sh
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
SGM=(trainer=gpu trainer.max_epochs=1)

step "0 preflight (${PY}${WHEEL_TARGET:+, wheels in $WHEEL_TARGET})"
"$PY" benchmarks/gpu_preflight.py ${WHEEL_TARGET:+--target "$WHEEL_TARGET"} --fla \
  --experiment gated_deltanet trainer=gpu --experiment sgm_lipschitz "${SGM[@]}" \
  $([ "$PREFLIGHT_ONLY" = 1 ] || echo --cuda)
[ "$PREFLIGHT_ONLY" = 1 ] && { step "done (preflight only)"; exit 0; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

step "1/3 GPU tests (fla parity)"
RC=0
timeout 240 "$PY" -m pytest -q -rs -m gpu -p no:cacheprovider tests/ops/test_gated_delta_rule.py || RC=1

step "2/3 gated delta rule fwd+bwd at T=4096: fla Triton vs the suite's chunked path (and the recurrent twin)"
timeout 150 "$PY" -m benchmarks.gated_delta_rule --device cuda --T 4096 --B 2 --H 4 --D 64 --fla --threads 0 \
  --max-recurrent-s 30 --repeat 3 || RC=1

step "3/3 one epoch of the sgm_lipschitz paper profile (entry ring, seed 0) on the GPU"
rm -rf logs/gpu_check
timeout 120 "$PY" -m suite.claim sgm_lipschitz --profile paper --only ring --seeds 0 --out logs/gpu_check/sgm_lipschitz \
  --page logs/gpu_check/sgm_lipschitz.md "${SGM[@]:1}" || RC=1
[ -f logs/gpu_check/sgm_lipschitz.md ] && sed -n '/## Runs/,/## Budget/p' logs/gpu_check/sgm_lipschitz.md | head -20
step "done (exit $RC)"
exit $RC

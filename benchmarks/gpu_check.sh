#!/usr/bin/env bash
# GPU check, one short prepared script (< 10 min on one GPU); prints everything to record in an issue:
#   1. `make test-gpu`: the GPU tests (fla's Triton gated-delta-rule kernel vs the suite's chunked path: outputs,
#      final state and gradients, T = 1024 and 4096);
#   2. the gated delta rule benchmark at T = 4096 on CUDA, fla's Triton kernel beside the suite's chunked path;
#   3. a few minutes of one cheap paper-scale profile (sgm_lipschitz: embedded data, so no dataset is needed), on the
#      GPU, into logs/gpu_check/ (the results pages in docs/ are not touched).
# Usage: bash benchmarks/gpu_check.sh   (needs CUDA and the [gpu] extra: pip install -e '.[gpu]')
# Fails at once, with one line, on a machine without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export PYTHONPATH="$PWD" WANDB_MODE=offline WANDB_SILENT=true
[ -x "$PY" ] || { echo "error: $PY not found: run 'make install' first" >&2; exit 2; }
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "error: no CUDA device visible to torch: benchmarks/gpu_check.sh needs a GPU" >&2
  exit 2
fi
if ! "$PY" -c 'import fla' 2>/dev/null; then
  echo "error: flash-linear-attention is not installed: pip install -e '.[gpu]' (pyproject extra 'gpu')" >&2
  exit 2
fi
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import torch, fla; print("torch", torch.__version__, "cuda", torch.version.cuda, "fla", fla.__version__)'

step "1/3 make test-gpu (fla parity)"
timeout 240 make --no-print-directory test-gpu PYTEST_ARGS="-q -rs tests/ops/test_gated_delta_rule.py"

step "2/3 gated delta rule fwd+bwd at T=4096: fla Triton vs the suite's chunked path (and the recurrent twin)"
timeout 180 "$PY" -m benchmarks.gated_delta_rule --device cuda --T 4096 --B 2 --H 4 --D 64 --fla --threads 0 \
  --max-recurrent-s 60

step "3/3 a few minutes of the sgm_lipschitz paper profile (entry ring, 5 epochs, 3 seeds) on the GPU"
rm -rf logs/gpu_check
timeout 240 "$PY" -m suite.claim sgm_lipschitz --profile paper --only ring --out logs/gpu_check/sgm_lipschitz \
  --page logs/gpu_check/sgm_lipschitz.md trainer.max_epochs=5
sed -n '/## Final metrics/,/^$/p;/## Final metrics/,+6p' logs/gpu_check/sgm_lipschitz.md | head -12
step "done"

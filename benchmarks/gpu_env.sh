# Sourced by benchmarks/gpu_check.sh and benchmarks/gpu_claims.sh: choose the Python that runs the suite on a GPU
# machine and make the suite importable with it.
#   BARE=1 (a bare GPU machine: its own python3 with torch, lightning, torchmetrics, timm, torch-geometric, and no
#   network): installs the wheels of `make gpu-wheels` (folder $GPU_WHEELS, default .whl/) into a temporary target
#   with pip --no-index, and puts that target and the source tree on PYTHONPATH.
#   BARE=0 (default): the suite's own .venv (`make install`, plus `pip install -e '.[gpu]'` for fla).
# Sets PY and WHEEL_TARGET (empty unless BARE=1); exits with one line when something is missing.
BARE=${BARE:-0}
GPU_WHEELS=${GPU_WHEELS:-.whl}
export WANDB_MODE=offline WANDB_SILENT=true PYTHONUNBUFFERED=1
WHEEL_TARGET=""
if [ "$BARE" = 1 ]; then
  PY=${PY:-python3}
  command -v "$PY" >/dev/null || { echo "error: $PY not found (BARE=1 runs the machine's own Python)" >&2; exit 2; }
  "$PY" -c 'import torch' 2>/dev/null || { echo "error: $PY has no torch: --bare runs the machine's own Python, which \
must bring torch, lightning, torchmetrics, timm and torch-geometric (PY=<python> picks another one)" >&2; exit 2; }
  shopt -s nullglob
  wheels=("$GPU_WHEELS"/*.whl)
  shopt -u nullglob
  [ ${#wheels[@]} -gt 0 ] || { echo "error: no wheels in $GPU_WHEELS: run 'make gpu-wheels' first" >&2; exit 2; }
  WHEEL_TARGET=$(mktemp -d "${TMPDIR:-/tmp}/suite-wheels.XXXXXX")
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$WHEEL_TARGET" "${wheels[@]}" \
    || { echo "error: the wheels in $GPU_WHEELS did not install into $WHEEL_TARGET" >&2; exit 2; }
  trap 'rm -rf "$WHEEL_TARGET"' EXIT
  export PYTHONPATH="$WHEEL_TARGET:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  PY=${PY:-.venv/bin/python}
  [ -x "$PY" ] || { echo "error: $PY not found: run 'make install' first (or BARE=1 on a bare GPU machine)" >&2; exit 2; }
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# Shared set-up for ./scripts/demo and ./scripts/test (sourced, not run).
# Creates .venv if missing and installs eroica with CPU torch and MPICH from PyPI.
# Idempotent and quick when everything is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EROICA_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
TORCH_VERSION="${EROICA_TORCH_VERSION:-2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
VPY="$VENV/bin/python"

if ! "$VPY" -c "import torch" 2>/dev/null; then
  # Never let set-up pull a multi-GB CUDA build: a CPU wheel from local disk (find-links) first,
  # else PyTorch's CPU index.
  # "+cpu" is a CPU-only build's local version: a local wheel (pip's find-links) or PyTorch's CPU
  # index has it; PyPI's plain torch (CUDA on Linux) never matches it.
  echo "[setup] installing torch==$TORCH_VERSION+cpu"
  "$VPY" -m pip install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null \
    || "$VPY" -m pip install -q "torch==$TORCH_VERSION+cpu" --index-url https://download.pytorch.org/whl/cpu \
         --extra-index-url https://pypi.org/simple
fi

stamp="$VENV/.eroica-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  echo "[setup] installing eroica (editable) with MPICH, NVML bindings and test tools"
  "$VPY" -m pip install -q -e "$ROOT[mpich,gpu,test]"
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"

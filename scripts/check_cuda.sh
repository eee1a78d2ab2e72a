#!/usr/bin/env bash
# One-command check of autofit's CUDA backend on a machine with a GPU and a CUDA build of torch.
# Usage: scripts/check_cuda.sh            (PYTHON=/path/to/python to pick the interpreter)
set -u
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
# Make `import autofit` point at this checkout; harmless if already installed or offline.
"$PYTHON" -m pip install -e . --no-deps -q >/dev/null 2>&1 || true
exec "$PYTHON" scripts/check_cuda.py "$@"

#!/usr/bin/env bash
# Create .venv (if missing) and install tensoropt with its test extras.
# torch is pinned to 2.13.0: pip takes the CPU build from a local file; an unpinned torch
# would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev]"

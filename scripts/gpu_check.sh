#!/usr/bin/env bash
# The GPU check in one command (scripts/gpu_check.py says what it runs): on a GPU machine with this
# repository and its environment (a CUDA build of torch), no network needed, under 10 minutes.
#   bash scripts/gpu_check.sh [--dry-run] [--out results/gpu_check] [--work DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" scripts/gpu_check.py "$@"

#!/usr/bin/env bash
# The GPU check in one command (scripts/gpu_check.py says what it runs): on a GPU machine with this
# repository and its environment (a CUDA build of torch), no network needed, under 10 minutes.
# Where the machine's Python lacks the project's other dependencies, wheels made beforehand by
# scripts/gpu_wheels.sh in .whl/ (or $GPU_WHEELS) are installed into a temporary folder first.
#   bash scripts/gpu_check.sh [--dry-run] [--out results/gpu_check] [--work DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
wheels=${GPU_WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
    site=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" -m scripts.gpu_check "$@"

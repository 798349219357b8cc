#!/usr/bin/env bash
# Installs parakeet-stream into .venv (again only when pyproject.toml changed) and starts the server.
# Without --model it serves `small` (NVIDIA's 120M model: downloaded and converted on the first
# start, from the cache afterwards); with no network it says so and serves the bundled demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if [ ! -x .venv/bin/parakeet-serve ] || [ pyproject.toml -nt .venv/bin/parakeet-serve ]; then
    bash scripts/install_torch.sh .venv/bin/pip  # torch alone from PARAKEET_TORCH_INDEX, if set
    .venv/bin/pip install -q -e .
    touch .venv/bin/parakeet-serve
fi
for arg in "$@"; do
    case "$arg" in --model|--model=*) exec .venv/bin/parakeet-serve "$@" ;; esac
done
.venv/bin/parakeet-serve --check "$@"  # a taken port or a missing GPU says so before any download
status=0
.venv/bin/python -m parakeet_stream.tools.fetch small --fallback demo >/dev/null || status=$?
case $status in
    0) exec .venv/bin/parakeet-serve --model small "$@" ;;
    3) exec .venv/bin/parakeet-serve --model demo "$@" ;;  # no network: the line above said so
    *) exit "$status" ;;
esac

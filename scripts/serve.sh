#!/usr/bin/env bash
# Installs parakeet-stream into .venv and starts the server on the bundled demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e .
exec .venv/bin/parakeet-serve "$@"

#!/usr/bin/env bash
# Installs everything the tests need into .venv (and system packages when root) and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # podman, mmdebstrap and runc (podman's runtime on every cgroup layout): the container image test
    missing=$(for p in espeak-ng chromium haproxy fortunes podman mmdebstrap runc; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [ -n "$missing" ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
bash scripts/install_torch.sh .venv/bin/pip  # torch alone from PARAKEET_TORCH_INDEX, if set
.venv/bin/pip install -q -e '.[test,frameworks]'
exec .venv/bin/python -m pytest -q "$@"

#!/usr/bin/env bash
# Installs torch with a virtual environment's pip: from PARAKEET_TORCH_INDEX when it is set (torch
# alone: e.g. https://download.pytorch.org/whl/cpu), its dependencies from pip's usual index. An
# index that cannot be reached, or has no such torch, is said in one line and the usual index
# serves torch too. scripts/serve.sh, scripts/test.sh and the Containerfile run it.
#   bash scripts/install_torch.sh .venv/bin/pip [VERSION]
set -euo pipefail
pip=$1
version=${2:-2.13.0}
# no retries: an index that is down fails at once, not after pages of warnings
if [ -n "${PARAKEET_TORCH_INDEX:-}" ] && ! "$pip" install -q --no-deps --retries 0 --timeout 15 "torch==$version" \
        --index-url "$PARAKEET_TORCH_INDEX" >/dev/null 2>&1; then
    echo "install_torch.sh: no torch $version from $PARAKEET_TORCH_INDEX (unreachable, or no such wheel there):" \
        "installing it from the usual index" >&2
fi
"$pip" install -q "torch==$version"  # its dependencies (and torch itself if the line above did not) from the usual index

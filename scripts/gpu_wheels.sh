#!/usr/bin/env bash
# Wheels for a GPU machine that has Python with a CUDA build of torch (and numpy, sentencepiece,
# safetensors, pyyaml, tqdm, prometheus-client, h11, protobuf, pytest) but no network: the rest of
# what scripts/gpu_check.sh needs, at the versions of this checkout's .venv, into .whl/
# (git-ignored). gpu_check.sh installs them from there into a temporary folder before it runs.
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION]    # the GPU machine's Python, default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=${1:-3.12}
[[ $python_version =~ ^3\.[0-9]+$ ]] || { echo "gpu_wheels: the GPU machine's Python version, e.g. 3.12; got '$python_version'" >&2; exit 2; }
[ -x .venv/bin/python ] || { echo "gpu_wheels: no .venv here: run the README's set-up first (its versions are the ones fetched)" >&2; exit 2; }
packages=(trio outcome sniffio trio-websocket wsproto msgspec orjson soundfile cffi pycparser soxr
          python-multipart nvidia-riva-client grpcio pytest-trio)
pins=$(.venv/bin/python - "${packages[@]}" <<'PY'
import importlib.metadata as md, sys
print(" ".join(f"{name}=={md.version(name)}" for name in sys.argv[1:]))
PY
)
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
# shellcheck disable=SC2086
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp "${platforms[@]}" -d .whl $pins
du -sh .whl

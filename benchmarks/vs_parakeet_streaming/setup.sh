#!/usr/bin/env bash
# One-time set-up of the side-by-side CPU benchmark: parakeet-stream (this repository's .venv) vs
# parakeet-streaming (https://github.com/odunola499/parakeet-streaming) on the same full-size
# random-weight `small` model.
# Usage, after the README's set-up (scripts/serve.sh or scripts/test.sh made .venv):
#   bash benchmarks/vs_parakeet_streaming/setup.sh
# Everything goes under $BENCH_DIR (default: results/vs_parakeet_streaming/ of this repository,
# git-ignored). PS_GIT names the parakeet-streaming repository to clone (a URL or a local clone).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); project=$(cd "$here/../.." && pwd)
work=${BENCH_DIR:-$project/results/vs_parakeet_streaming}; mkdir -p "$work"; work=$(cd "$work" && pwd)
ps_git=${PS_GIT:-https://github.com/odunola499/parakeet-streaming}
[[ -x $project/.venv/bin/parakeet-serve ]] || { echo "run the README's set-up first (.venv/bin/parakeet-serve is missing)"; exit 1; }
# parakeet-streaming reads its weights from the Hugging Face hub; ps.patch adds only PS_WEIGHTS_DIR
# (read a local folder instead). If it no longer applies, parakeet-streaming has changed: check out
# an older commit in $work/ps-src.
[[ -d $work/ps-src ]] || { git clone -q "$ps_git" "$work/ps-src" && (cd "$work/ps-src" && git apply "$here/ps.patch"); }
if [[ ! -x $work/ps-venv/bin/parakeet-server ]]; then
  python3 -m venv "$work/ps-venv"
  "$work/ps-venv/bin/pip" install -q torch==2.13.0
  # its declared dependencies, minus torchaudio/torchcodec: it never imports them and they have no build for torch 2.13
  "$work/ps-venv/bin/pip" install -q "pydantic>=2.12.5" "sentencepiece>=0.2.1" "librosa>=0.11.0" "huggingface-hub>=1.2.3" \
      "safetensors>=0.7.0" "soundfile>=0.13.1" "trio>=0.32.0" "trio-websocket>=0.11.0" "trio-websockets>=0.2"
  "$work/ps-venv/bin/pip" install -q --no-deps -e "$work/ps-src"
fi
ln -sfn "$project/.venv" "$work/ours-venv"
[[ -f $work/random-small/model.safetensors ]] || (cd "$project" && .venv/bin/python -m demo_model.random_model small "$work/random-small")
[[ -f $work/ps-small/model.safetensors ]] || (cd "$project" && "$work/ps-venv/bin/python" -m benchmarks.vs_parakeet_streaming.ps_weights "$work/random-small" "$work/ps-small")
[[ -f $work/audio/speech20.wav ]] || (cd "$project" && .venv/bin/python -m benchmarks.vs_parakeet_streaming.make_audio "$work/audio")
echo "ready: BENCH_DIR=$work .venv/bin/python -m benchmarks.vs_parakeet_streaming.bench --out $work/default.json"
echo "       python3 -m benchmarks.vs_parakeet_streaming.table $work/default.json"

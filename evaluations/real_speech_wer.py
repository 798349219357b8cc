#!/usr/bin/env python3
"""Real-speech check: WER of a model on Debian's five LibriVox recordings.

    python -m evaluations.real_speech_wer --model weights/demo

The recordings (16 kHz read speech with transcripts) come with ``pocketsphinx-testdata``
(``apt-get install -y pocketsphinx-testdata``) under
``/usr/share/pocketsphinx/test/data/librivox/``.  They are a check that is reported and
never tuned on: nothing trains on them.  Each file goes through the repository's
cache-aware streaming engine (as ``parakeet-transcribe`` does) and, for comparison, the
whole-utterance offline forward; references and hypotheses are normalised to lowercase
words the way ``demo_model/data.py`` normalises the training text, and scored with the
trainer's WER (``parakeet_stream.training.data.wer``).  Prints JSON: per file and total.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import torch

from demo_model.data import normalize

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.options import add_engine_arguments, engine_options
from parakeet_stream.host import single_threaded_host
from parakeet_stream.model.loading import load_model
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.precision import set_precision
from parakeet_stream.training.data import edit_distance, wer
from parakeet_stream.tools.transcribe import (
    load_audios,
    transcribe_offline,
    transcribe_streaming,
)

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")


def read_references(data: Path) -> dict[str, str]:
    """{file id: normalised text} from ``fileids`` + ``transcription`` (``<s> text </s> (id)``)."""
    ids = data.joinpath("fileids").read_text().split()
    refs = {}
    for line in data.joinpath("transcription").read_text().splitlines():
        m = re.match(r"^(.*)\((\S+)\)\s*$", line.strip())
        if m:
            refs[m.group(2)] = words(re.sub(r"</?s>", " ", m.group(1)))
    missing = [i for i in ids if i not in refs]
    if missing:
        sys.exit(f"no transcription for {missing}")
    return {i: refs[i] for i in ids}


def words(text: str) -> str:
    """demo_model/data.py's normalisation; plain lowercase words where it refuses a sentence."""
    ws = normalize(text)
    return " ".join(ws) if ws else " ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split())


def score(refs: dict[str, str], hyps: dict[str, str]) -> dict:
    files = {}
    for fid, ref in refs.items():
        hyp = words(hyps[fid])
        files[fid] = {"ref": ref, "hyp": hyp, "words": len(ref.split()),
                      "errors": edit_distance(ref.split(), hyp.split()), "wer": round(wer([ref], [hyp]), 4)}
    total = wer(list(refs.values()), [words(hyps[f]) for f in refs])
    return {"wer": round(total, 4), "words": sum(f["words"] for f in files.values()),
            "errors": sum(f["errors"] for f in files.values()), "files": files}


def load_recordings(data: Path) -> tuple[dict[str, str], dict]:
    """(references, audio) by file id."""
    refs = read_references(data)
    audios, failed = load_audios([str(data / f"{fid}.wav") for fid in refs])
    if failed:
        sys.exit(f"unreadable: {[t.error for t in failed.values()]}")
    return refs, {Path(k).stem: v for k, v in audios.items()}


def offline_report(model: ParakeetModel, data: Path = LIBRIVOX) -> dict | None:
    """The whole-utterance figure (what the trainer's README shows); None without the data."""
    if not data.joinpath("transcription").is_file():
        return None
    refs, audios = load_recordings(data)
    with torch.inference_mode():
        return score(refs, {k: t.text for k, t in transcribe_offline(model, audios).items()})


def model_digest(model: str) -> str | None:
    """First 12 hex digits of the weights' SHA-256 (weights/demo changes while it trains)."""
    path = Path(model) / "model.safetensors"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12] if path.is_file() else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="weights/demo", help="model folder or name (default weights/demo)")
    ap.add_argument("--data", type=Path, default=LIBRIVOX, help=f"recordings folder (default {LIBRIVOX})")
    ap.add_argument("--device", default="cpu", help="torch device (default cpu)")
    add_engine_arguments(ap)
    args = ap.parse_args(argv)
    if not args.data.joinpath("transcription").is_file():
        sys.exit(f"no {args.data}/transcription: apt-get install -y pocketsphinx-testdata")
    single_threaded_host()
    refs, audios = load_recordings(args.data)
    model = set_precision(load_model(args.model, args.device), args.dtype, args.quantize)
    options = engine_options(args) | {"dtype": model.encoder_dtype, "quantize": None}
    with ASREngine(model, args.device, max_num_streams=len(audios), max_queue=len(audios), **options) as engine:
        streaming = transcribe_streaming(engine, audios)
    with torch.inference_mode():
        offline = transcribe_offline(model, audios)
    report = {"model": args.model, "model_sha256": model_digest(args.model), "data": str(args.data),
              "audio_seconds": round(sum(len(a) for a in audios.values()) / 16000, 2),
              "streaming": score(refs, {k: t.text for k, t in streaming.items()}),
              "offline": score(refs, {k: t.text for k, t in offline.items()})}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""WER of a model folder on a demo corpus's test sets, in total and per synthesizer.

    python -m evaluations.demo_eval --model weights/demo --data data/demo_multi

The trainer's evaluation (greedy whole-utterance decoding, identical to streaming) on every
utterance of test_sentences and test_voices, split by the synthesizer that spoke it, so two
models can be compared on the same corpus.  Features come from the corpus's cache (built on
first use).  Prints JSON.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import numpy as np
import torch

from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.tokenizer import Tokenizer
from parakeet_stream.training.data import FeatureSet, wer
from parakeet_stream.training.objective import transcribe_offline


def split_wer(model: ParakeetModel, tok: Tokenizer, data: Path, split: str) -> dict:
    fs = FeatureSet(data, split, data / "feats", model.cfg.features, log=lambda *_: None)
    feats = [torch.from_numpy(np.asarray(fs.feats(i), dtype=np.float32)) for i in range(len(fs))]
    hyps = [tok.decode(h) for h in transcribe_offline(model, feats)]
    by_synth = collections.defaultdict(lambda: ([], []))
    for rec, hyp in zip(fs.records, hyps):
        refs, outs = by_synth[rec.get("synth", "espeak")]
        refs.append(rec["text"])
        outs.append(hyp)
    return {"all": round(wer([r["text"] for r in fs.records], hyps), 4), "utterances": len(hyps),
            **{name: {"wer": round(wer(*pair), 4), "utterances": len(pair[0])}
               for name, pair in sorted(by_synth.items())}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "weights" / "demo"), help="exported model folder")
    ap.add_argument("--data", default=str(ROOT / "data" / "demo"), help="corpus folder (python -m demo_model.data)")
    args = ap.parse_args(argv)
    model_dir, data = Path(args.model), Path(args.data)
    for need in (model_dir / "config.json", data / "test_sentences.jsonl"):
        if not need.is_file():
            sys.exit(f"{need} not found: --model wants an exported model folder, --data a demo corpus")
    model = ParakeetModel.from_dir(model_dir).eval()
    tok = Tokenizer(model_dir / "tokenizer.model")
    print(json.dumps({split: split_wer(model, tok, data, split)
                      for split in ("test_sentences", "test_voices")}, indent=1))


if __name__ == "__main__":
    main()

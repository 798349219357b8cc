#!/usr/bin/env python3
"""WER and confidence separation of a model folder on a demo corpus's test sets, in total and per synthesizer.

    python -m evaluations.demo_eval --model weights/demo --data data/demo_multi

The trainer's evaluation (greedy whole-utterance decoding, identical to streaming) on every
utterance of test_sentences and test_voices, split by the synthesizer that spoke it, so two
models can be compared on the same corpus.  Each word's confidence is the one the server sends
(the lowest probability the joint gave its tokens); the hypothesis words aligned to the reference
(a minimum edit alignment) are right or wrong, and the report says how well the confidence tells
them apart: the mean of each, the share of each under 0.5, and the AUC (the chance that a right
word has the higher confidence of a right and a wrong one).  Features come from the corpus's cache
(built on first use).  Prints JSON.
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
from parakeet_stream.server.streams.words import group_words, word_confidence
from parakeet_stream.training.data import FeatureSet, aligned_right, wer
from parakeet_stream.training.objective import decode_offline


def split_report(model: ParakeetModel, tok: Tokenizer, data: Path, split: str) -> dict:
    fs = FeatureSet(data, split, data / "feats", model.cfg.features, log=lambda *_: None)
    feats = [torch.from_numpy(np.asarray(fs.feats(i), dtype=np.float32)) for i in range(len(fs))]
    groups = collections.defaultdict(list)
    for rec, labels in zip(fs.records, decode_offline(model, feats)):
        words = group_words(tok, [(token, frame, p) for token, frame, p in labels if token not in tok.special_ids])
        hyp = [(tok.decode([token for token, _, _ in word]).strip(), word_confidence(word)) for word in words]
        for name in ("all", rec.get("synth", "espeak")):
            groups[name].append((rec["text"], [w for w, _ in hyp], [c for _, c in hyp]))
    return {name: report(utts) for name, utts in sorted(groups.items(), key=lambda kv: (kv[0] != "all", kv[0]))}


def report(utts: list[tuple[str, list[str], list[float]]]) -> dict:
    """WER and how the words' confidences tell right words from wrong ones."""
    right, wrong = [], []
    for ref, hyp, confidences in utts:
        for ok, c in zip(aligned_right(ref.split(), hyp), confidences):
            (right if ok else wrong).append(c)
    return {"wer": round(wer([ref for ref, _, _ in utts], [" ".join(hyp) for _, hyp, _ in utts]), 4),
            "utterances": len(utts), "words_right": len(right), "words_wrong": len(wrong),
            **separation(np.array(right), np.array(wrong))}


def separation(right: np.ndarray, wrong: np.ndarray) -> dict:
    """Mean confidence of right and wrong words, the share of each under 0.5, and the AUC: the chance
    that a right word has a higher confidence than a wrong one (ties count half)."""
    if not len(right) or not len(wrong):
        return {}
    ranked = np.sort(wrong)
    above = np.searchsorted(ranked, right, "left") + np.searchsorted(ranked, right, "right")
    return {"confidence_right": round(float(right.mean()), 3), "confidence_wrong": round(float(wrong.mean()), 3),
            "right_under_0.5": round(float((right < 0.5).mean()), 3),
            "wrong_under_0.5": round(float((wrong < 0.5).mean()), 3),
            "auc": round(float(above.sum() / 2 / (len(right) * len(wrong))), 3)}


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
    print(json.dumps({split: split_report(model, tok, data, split)
                      for split in ("test_sentences", "test_voices")}, indent=1))


if __name__ == "__main__":
    main()

"""The model's own `<EOU>` probabilities on the recordings of `benchmarks.turns`, without a server.

    python -m benchmarks.turn_probabilities                       # the bundled demo model
    python -m benchmarks.turn_probabilities --model results/demo  # a model folder, e.g. a training export

A greedy pass over each whole recording (what streaming computes: the encoder's chunked attention
is the same) keeps, per encoder frame, whether it wrote `<EOU>` and else the highest `<EOU>`
probability of its steps. Printed: from each mid-sentence pause to the end of its sentence (where
`benchmarks.turns` counts an `EndOfTurn` as false), where `<EOU>` was written and the median of the
highest probability where it was not; after each real end of a turn, where `<EOU>` was written
before the next turn and how much audio after the end of speech its frame had heard. A model that
tells a hesitation from an end writes it at the ends and not at the pauses; `benchmarks.turns`
measures what the server makes of that (an `<EOU>` written firms up to an `EndOfTurn` within half a
second of silence). It runs in seconds without real-time pacing, so it can follow a training run
on a busy machine.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.turns import EARLY, GAP, recordings
from parakeet_stream.model.errors import ModelNotFound
from parakeet_stream.model.loading import load_model

FRAME = 0.08  # seconds of audio per encoder frame


@torch.no_grad()
def eou_per_frame(model, audio: np.ndarray) -> np.ndarray:
    """The highest <EOU> probability of each encoder frame's greedy steps; 1 where it wrote <EOU>
    (the label a turn's end firms up from, whatever its probability)."""
    feats, _ = model.features(torch.from_numpy(audio.astype(np.float32)))
    enc, _ = model.encoder(feats[None], torch.tensor([feats.shape[0]]))
    dec = model.decoder
    blank, eou = dec.cfg.num_classes, model.tokenizer.eou_id
    h = enc.new_zeros(dec.cfg.pred_rnn_layers, 1, dec.cfg.pred_hidden)
    g, state = dec.predictor(torch.tensor([[blank]]), (h, h.clone()))
    frames = dec.joint.enc(enc[0])
    best = np.zeros(len(frames))
    for t in range(len(frames)):
        for _ in range(dec.cfg.max_symbols):
            p = dec.joint(frames[t][None, None], dec.joint.pred(g)).reshape(-1).softmax(-1)
            best[t] = max(best[t], float(p[eou]))
            label = int(p.argmax())
            if label == eou:
                best[t] = 1.0
            if label == blank:
                break
            g, state = dec.predictor(torch.tensor([[label]]), state)
    return best


def heard(p: np.ndarray) -> np.ndarray:
    return (np.arange(len(p)) + 1) * FRAME  # a frame's decision has heard its lookahead frame too


def highest(p: np.ndarray, start: float, end: float) -> float:
    return float(p[(heard(p) >= start) & (heard(p) < end)].max(initial=0.0))


def first_written(p: np.ndarray, end: float) -> float | None:
    """Seconds from `end` to the first frame after it that wrote <EOU> before the next turn."""
    at = heard(p)
    written = np.flatnonzero((p == 1) & (at >= end - EARLY) & (at < end + GAP))
    return float(at[written[0]] - end) if len(written) else None


def summary(values: list[float]) -> str:
    v = np.array(values)
    return (f"<EOU> written at {int((v == 1).sum())} of {len(v)}; the highest probability where not: "
            f"median {np.median(v[v < 1]) if (v < 1).any() else float('nan'):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo", help="a model name or folder with <EOU> in its vocabulary")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        model = load_model(args.model).eval()
    except (ModelNotFound, OSError) as exc:
        raise SystemExit(f"--model {args.model}: {exc}") from None
    if getattr(model.tokenizer, "eou_id", None) is None:
        raise SystemExit(f"{args.model} has no <EOU> label")
    pauses, ends = [], []
    for r in recordings():
        p = eou_per_frame(model, r["audio"])
        pauses += [highest(p, a, b - EARLY) for a, b in r["pauses"]]
        ends += [first_written(p, end) for _, end in r["turns"]]
    found = [1000 * e for e in ends if e is not None]
    print(f"{args.model}:")
    print(f"  from a mid-sentence pause to the end of its sentence: {summary(pauses)}")
    print(f"  after a turn's end, within the {GAP:g} s before the next: <EOU> written at {len(found)} of {len(ends)}, "
          f"heard {np.percentile(found, 50):.0f} / {np.percentile(found, 95):.0f} ms (p50 / p95) after the end of speech")


if __name__ == "__main__":
    main()

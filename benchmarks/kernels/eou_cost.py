"""What the end-of-turn confidence costs a greedy decode: one streaming chunk per stream, decoded
with and without keeping the `<EOU>` label's probability, interleaved, the median of each.

The decoder has a real checkpoint's shape with random weights (default `small`, NVIDIA's 120M
end-of-utterance model, tests/fixtures/nemo/small_model_config.yaml); the `<EOU>` label is the id
that checkpoint's vocabulary gives it (small: 1024 of 1026 labels, `<EOB>` after it, blank last).
Random weights emit more labels than a trained model, so the cost found is an upper bound.

    python -m benchmarks.kernels.eou_cost [--batches 1 16 64] [--rounds 30] [--threads 2]
"""
from __future__ import annotations

import argparse
import time

import torch
import yaml

from benchmarks.common import percentile
from demo_model.random_model import FIXTURES, preset_config
from parakeet_stream.model.config import DecoderConfig, EncoderConfig, ModelConfig
from parakeet_stream.model.greedy import GreedyPass
from parakeet_stream.model.parakeet import ParakeetModel

EOU_PIECE = "<EOU>"
CHUNK_FRAMES = 2  # encoder frames one stream step decodes (the 160 ms mode's, at 80 ms a frame)


def eou_id(preset: str) -> int:
    """The id of `<EOU>` in the preset checkpoint's vocabulary (the joint's labels, blank excluded)."""
    vocabulary = yaml.safe_load((FIXTURES / f"{preset}_model_config.yaml").read_text())["joint"]["vocabulary"]
    if EOU_PIECE not in vocabulary:
        raise SystemExit(f"eou_cost: the {preset} model has no {EOU_PIECE} label: it pays nothing")
    return vocabulary.index(EOU_PIECE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", help="the checkpoint whose decoder shape and <EOU> id to use")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64], help="streams per decode")
    ap.add_argument("--rounds", type=int, default=30, help="decodes of each kind (alternating) per batch")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    real = preset_config(args.preset).decoder
    eou = eou_id(args.preset)
    d_model = preset_config(args.preset).encoder.d_model
    cfg = ModelConfig(encoder=EncoderConfig(n_layers=1, d_model=d_model),  # the encoder is not timed: one layer
                      decoder=DecoderConfig(num_classes=real.num_classes, pred_hidden=real.pred_hidden,
                                            joint_hidden=real.joint_hidden))
    dec = ParakeetModel(cfg).eval().decoder
    for b in args.batches:
        enc, lengths, state = torch.randn(b, CHUNK_FRAMES, d_model), torch.full((b,), CHUNK_FRAMES), dec.initial_state(b)
        times: dict[int | None, list[float]] = {None: [], eou: []}
        with torch.inference_mode():
            for _ in range(args.rounds):
                for label in (None, eou):
                    t = time.perf_counter()
                    GreedyPass(dec, enc, lengths, state, eou=label).run().scored()
                    times[label].append(time.perf_counter() - t)
        without, with_eou = percentile(times[None], 50) * 1e3, percentile(times[eou], 50) * 1e3
        print(f"batch {b}: without {without:.3f} ms, with <EOU> probability {with_eou:.3f} ms "
              f"(+{(with_eou / without - 1) * 100:.0f}%)")


if __name__ == "__main__":
    main()

"""Per-step greedy decode time: label looping (model/greedy.py) against the frame-looping decoder
it replaced (benchmarks/kernels/frame_looping.py), at several batch sizes, on one chunk per stream.

Encoder outputs are the model's own on looped speech, cut into the chunks a stream step decodes
(out_frames of the lookahead mode), so the token rate is the model's.

    python -m benchmarks.kernels.decode --model weights/random-small --batches 1 8 32 128
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.common import percentile, speech
from benchmarks.kernels.frame_looping import frame_looping
from parakeet_stream.host import single_threaded_host
from parakeet_stream.model.loading import load_model


@torch.inference_mode()
def chunks(model, lookahead, count: int) -> torch.Tensor:
    """`count` encoder chunks [count, T, D] of speech (T = the mode's encoder frames per step)."""
    spec = model.encoder.chunk_spec(lookahead)
    feats, valid = model.features(torch.from_numpy(speech(max(4.0, count * spec.out_frames * model.frame_seconds), 0)))
    enc, _ = model.encoder(feats[None], torch.tensor([valid]), lookahead)
    frames = enc.size(1) // spec.out_frames * spec.out_frames
    return enc[0, :frames].reshape(-1, spec.out_frames, enc.size(2))[:count].float()


@torch.inference_mode()
def per_step_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return percentile(times, 50) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="weights/random-small")
    ap.add_argument("--lookahead", default=None, help="L,R (default: the model's first mode)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    single_threaded_host()  # the decode stage runs single-threaded
    model = load_model(args.model)
    lookahead = tuple(int(v) for v in args.lookahead.split(",")) if args.lookahead else model.cfg.default_lookahead
    pool = chunks(model, lookahead, max(args.batches))
    dec, rows = model.decoder, {}
    for b in args.batches:
        enc = pool[torch.arange(b) % pool.size(0)]
        lens = torch.full((b,), enc.size(1))
        state = dec.initial_state(b)
        found, _ = frame_looping(dec, enc, lens, state)
        assert dec.decode(enc, lens, state)[0].per_stream(b) == found, "label looping disagrees"
        rows[b] = {
            "frame_looping_ms": per_step_ms(lambda: frame_looping(dec, enc, lens, state), args.repeats),
            "label_looping_ms": per_step_ms(lambda: dec.decode(enc, lens, state), args.repeats),
            "tokens_per_stream": sum(map(len, found)) / b,
        }
        print(f"batch {b:4d}: {json.dumps(rows[b])}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "lookahead": lookahead, "per_step": rows}, indent=2))


if __name__ == "__main__":
    main()

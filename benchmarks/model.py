"""Model-level speed: RTFx of streaming transcription (files batched) and encoder stream-step time.

    python -m benchmarks.model --model weights/random-small --seconds 60 [--dtype float16 | --quantize int8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, percentile, speech
from parakeet_stream.model.conformer import EncoderCache
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.options import add_engine_arguments
from parakeet_stream.host import single_threaded_host, usable_cores
from parakeet_stream.model.loading import load_model
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.precision import set_precision
from parakeet_stream.tools.transcribe import transcribe_streaming

def rtfx(model: ParakeetModel, batch: int, seconds: float) -> float:
    audios = {f"file{i}": speech(seconds, i) for i in range(batch)}
    with ASREngine(model, max_num_streams=batch, dtype=model.encoder_dtype) as engine:
        t0 = time.perf_counter()
        transcribe_streaming(engine, audios)
        wall = time.perf_counter() - t0
    return batch * seconds / wall


@torch.inference_mode()
def step_ms(model: ParakeetModel, batch: int, repeats: int = 20) -> dict:
    lookahead = model.cfg.default_lookahead
    spec = model.encoder.chunk_spec(lookahead)
    feats = torch.randn(batch, spec.window, model.cfg.features.n_mels).to(model.encoder_dtype)
    lengths = torch.full((batch,), spec.window)
    start = torch.zeros(batch, dtype=torch.long)
    cache = EncoderCache.zeros(model.cfg.encoder, batch, dtype=model.encoder_dtype)
    cache.length.fill_(lookahead[0])
    slots = torch.arange(batch)
    times = {"pre_encode": [], "layers": []}
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        x, lens = model.encoder.stream_pre_encode(feats, lengths, start, lookahead)
        t1 = time.perf_counter()
        model.encoder.stream_layers(x, lens, cache, slots, lookahead)
        t2 = time.perf_counter()
        if i >= 3:
            times["pre_encode"].append(t1 - t0)
            times["layers"].append(t2 - t1)
    return {k: percentile(v, 50) * 1000 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="weights/random-small")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_model.json")
    add_engine_arguments(ap)
    args = ap.parse_args()
    single_threaded_host()  # the step is timed here in the main thread, as one OpenMP team
    model = set_precision(load_model(args.model), args.dtype, args.quantize)
    threads = args.threads or usable_cores()
    out = {"model": args.model, "dtype": args.dtype, "quantize": args.quantize, "threads": threads,
           "rtfx": {}, "encoder_step_ms": {}}
    for b in (1, 8):
        out["rtfx"][b] = rtfx(model, b, args.seconds)
        print(f"RTFx batch {b}: {out['rtfx'][b]:.1f}", flush=True)
    torch.set_num_threads(threads)
    for b in (1, 4, 8, 16, 32):
        out["encoder_step_ms"][b] = step_ms(model, b)
        print(f"encoder step batch {b}: {out['encoder_step_ms'][b]}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""What the multilingual model's language prompt costs beside its encoder: one streaming step of
the encoder layers against the prompt projection (model/prompt.py), random full-size weights from
the real checkpoint's configuration, 16 streams of mixed languages, on this machine's CPU.

    python -m benchmarks.kernels.prompt [--batch 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from demo_model.random_model import preset_config
from parakeet_stream.model.conformer import EncoderCache
from parakeet_stream.model.parakeet import ParakeetModel


def timed(call, repeats: int) -> float:
    call()
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = preset_config("multilingual")
    model = ParakeetModel(cfg).eval()
    b = args.batch
    prompts = torch.randint(0, cfg.prompt.num_prompts, (b,))
    with torch.inference_mode():
        for mode in cfg.encoder.att_context_sizes:
            frames = model.encoder.chunk_spec(mode).out_frames
            cache = EncoderCache.zeros(cfg.encoder, b, torch.device("cpu"), torch.float32)
            x = torch.randn(b, frames, cfg.encoder.d_model)
            lengths, slots = torch.full((b,), frames), torch.arange(b)
            layers = timed(lambda: model.encoder.stream_layers(x, lengths, cache, slots, mode), 3)
            prompt = timed(lambda: model.prompted(x, prompts), 20)
            print(f"lookahead {mode[0]},{mode[1]} ({frames} frames): encoder layers {layers * 1000:.0f} ms, "
                  f"prompt {prompt * 1000:.2f} ms ({prompt / layers:.1%})")


if __name__ == "__main__":
    main()

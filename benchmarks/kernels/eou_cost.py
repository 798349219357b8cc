#!/usr/bin/env python3
"""    python scripts/bench_eou_cost.py

Greedy decode of one streaming chunk per stream, with and without the <EOU> probability (the
small model's decoder shape, random weights), interleaved, median of 30."""
import time, torch, statistics
from parakeet_stream.model.config import ModelConfig, EncoderConfig, DecoderConfig
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.greedy import GreedyPass
torch.manual_seed(0); torch.set_num_threads(2)
cfg = ModelConfig(encoder=EncoderConfig(n_layers=1, d_model=512), decoder=DecoderConfig(num_classes=1026, pred_hidden=640, joint_hidden=640))
dec = ParakeetModel(cfg).eval().decoder
for b in (1, 16, 64):
    enc = torch.randn(b, 2, 512); lengths = torch.full((b,), 2); state = dec.initial_state(b)
    times = {None: [], 1025: []}
    with torch.inference_mode():
        for _ in range(30):
            for eou in (None, 1025):
                t = time.perf_counter(); GreedyPass(dec, enc, lengths, state, eou=eou).run().scored(); times[eou].append(time.perf_counter() - t)
    a, c = statistics.median(times[None]) * 1e3, statistics.median(times[1025]) * 1e3
    print(f"batch {b}: without {a:.3f} ms, with <EOU> probability {c:.3f} ms (+{(c/a-1)*100:.0f}%)")

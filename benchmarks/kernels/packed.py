"""bfloat16 encoder steps with the Linear weights packed for oneDNN (what `--dtype bfloat16` runs on a
CPU with native bfloat16) against plain bfloat16 Linear layers, alternating in one process, and
whether the two give the same bits.

    python -m benchmarks.kernels.packed --model weights/random-small --threads 2 --rounds 2
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.model import step_ms
from parakeet_stream.host import single_threaded_host, usable_cores
from parakeet_stream.model.loading import load_model
from parakeet_stream.model.packed import can_pack
from parakeet_stream.model.precision import set_precision


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="weights/random-small")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: every usable core)")
    ap.add_argument("--rounds", type=int, default=2, help="plain and packed timed in turn, this many times")
    args = ap.parse_args()
    if not can_pack(torch.device("cpu"), torch.bfloat16):
        raise SystemExit("bench_packed: this CPU has no native bfloat16 oneDNN kernels: nothing is packed here")
    single_threaded_host()
    plain = load_model(args.model)
    plain.encoder.to(torch.bfloat16)
    plain.encoder_dtype = torch.bfloat16
    packed = set_precision(load_model(args.model), "bfloat16")
    torch.set_num_threads(args.threads or usable_cores())
    with torch.inference_mode():
        feats = torch.randn(2, 64, plain.cfg.features.n_mels, dtype=torch.bfloat16)
        lengths = torch.tensor([64, 40])
        same = torch.equal(plain.encoder(feats, lengths)[0], packed.encoder(feats, lengths)[0])
    print(f"same bits: {same}")
    for r in range(args.rounds):
        for batch in (2, 8, 16):
            ms = {name: step_ms(model, batch)["layers"] for name, model in (("plain", plain), ("packed", packed))}
            print(f"round {r + 1}, batch {batch}: layers plain {ms['plain']:.1f} ms, packed {ms['packed']:.1f} ms "
                  f"({1 - ms['packed'] / ms['plain']:.0%} less)", flush=True)


if __name__ == "__main__":
    main()

"""Write a parakeet-stream model folder's weights in the NeMo-named safetensors layout that
parakeet-streaming's loader reads.

Inverts parakeet_stream/model/convert.py's NeMo->ours mapping (fused qkv -> linear_q/k/v, renamed
decoder/joint); drops features.fb/window (parakeet-streaming computes its own filterbank with
librosa). Then checks that parakeet-streaming's own remap_weights() + strict load_state_dict
accept the result and that every one of its tensors equals ours bit for bit. Run it with
parakeet-streaming's Python (setup.sh does):

    $BENCH_DIR/ps-venv/bin/python -m benchmarks.vs_parakeet_streaming.ps_weights $BENCH_DIR/random-small $BENCH_DIR/ps-small
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

RENAMES = [  # ours -> NeMo (inverse of convert.RENAMES)
    ("decoder.predictor.embed.", "decoder.prediction.embed."),
    ("decoder.predictor.lstm.", "decoder.prediction.dec_rnn.lstm."),
    ("decoder.joint.enc.", "joint.enc."),
    ("decoder.joint.pred.", "joint.pred."),
    ("decoder.joint.out.", "joint.joint_net.2."),
]


def to_nemo(ours: dict) -> dict:
    out = {}
    for k, v in ours.items():
        if k.startswith("features."):
            continue
        if ".self_attn.qkv." in k:
            assert k.endswith(".weight"), k  # use_bias: false in this model
            q, kk, vv = v.chunk(3, dim=0)
            base = k.replace(".qkv.weight", "")
            out[f"{base}.linear_q.weight"], out[f"{base}.linear_k.weight"], out[f"{base}.linear_v.weight"] = q, kk, vv
            continue
        for old, new in RENAMES:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    return {k: v.contiguous().clone() for k, v in out.items()}


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    ours = load_file(str(src / "model.safetensors"))
    emb = ours["decoder.predictor.embed.weight"]
    assert torch.count_nonzero(emb[-1]) == 0, "blank embedding row must be zero (parakeet-streaming feeds blank as start token)"
    nemo = to_nemo(ours)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(nemo, str(dst / "model.safetensors"))
    shutil.copy(src / "tokenizer.model", dst / "tokenizer.model")

    from parakeet.config import ModelConfig
    from parakeet.model import Parakeet, remap_weights

    model = Parakeet(ModelConfig())
    sd = remap_weights(dict(nemo))
    model.load_state_dict(sd)  # strict: raises on any missing/unexpected key
    ps = model.state_dict()
    back = {  # parakeet-streaming name -> ours name, for an element-wise check
        "predictor.prediction.embed.": "decoder.predictor.embed.",
        "predictor.prediction.dec_rnn.": "decoder.predictor.lstm.",
        "joiner.enc.": "decoder.joint.enc.",
        "joiner.pred.": "decoder.joint.pred.",
        "joiner.joint_net.2.": "decoder.joint.out.",
    }
    n = 0
    for k, v in ps.items():
        name = k
        for old, new in back.items():
            if k.startswith(old):
                name = new + k[len(old):]
        assert torch.equal(v, ours[name]), k
        n += 1
    print(f"wrote {dst}: {len(nemo)} NeMo-named tensors; parakeet-streaming strict load OK, {n} tensors identical to ours")


if __name__ == "__main__":
    main()

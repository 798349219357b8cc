"""Full-size models with random weights, for benchmarks (no download needed).

The structure comes from the real checkpoints' model_config.yaml values recorded in
tests/fixtures/nemo/{small,large}_model_config.yaml. The joint's blank bias is raised so
that roughly one frame in four emits a token, as speech does.

    python -m demo_model.random_model small weights/random-small
"""

from __future__ import annotations

import argparse
import random
import string
from pathlib import Path

import sentencepiece as spm
import torch
import yaml
from safetensors.torch import save_file

from parakeet_stream.model.config import ModelConfig
from parakeet_stream.model.parakeet import ParakeetModel

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nemo"


def preset_config(name: str) -> ModelConfig:
    return ModelConfig.from_nemo(yaml.safe_load((FIXTURES / f"{name}_model_config.yaml").read_text()))


def synthetic_tokenizer(path: Path, pieces: int, specials: list[str]) -> None:
    """A BPE model with exactly `pieces` + len(specials) entries, trained on random words."""
    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(20000)]
    lines = (" ".join(rng.choices(words, k=12)) for _ in range(20000))
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines, model_prefix=str(path.with_suffix("")), vocab_size=pieces + len(specials),
        model_type="bpe", user_defined_symbols=specials, minloglevel=2,
    )


def build(name: str, out: Path, token_rate: float = 0.25, seed: int = 0) -> Path:
    cfg = preset_config(name)
    torch.manual_seed(seed)
    model = ParakeetModel(cfg).eval()
    specials = ["<EOU>", "<EOB>"] if cfg.decoder.num_classes > 1024 else []
    out.mkdir(parents=True, exist_ok=True)
    synthetic_tokenizer(out / "tokenizer.model", cfg.decoder.num_classes - len(specials), specials)
    _bias_blank(model, token_rate)
    (out / "config.json").write_text(cfg.to_json())
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    return out


def _bias_blank(model: ParakeetModel, token_rate: float) -> None:
    """Raise the blank logit until about `token_rate` of random encoder frames emit a token."""
    joint = model.decoder.joint
    with torch.no_grad():
        f = joint.enc(torch.randn(2000, model.cfg.encoder.d_model))
        g = model.decoder.initial_state(1).g
        logits = joint(f, g)
        blank = logits[:, -1]
        best_other = logits[:, :-1].max(-1).values
        joint.out.bias[-1] += torch.quantile(best_other - blank, 1 - token_rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=["small", "large"])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    print(build(args.name, args.out))


if __name__ == "__main__":
    main()

"""`parakeet-convert SRC [DST_DIR]`: a NeMo `.nemo` checkpoint (or a Hugging Face model) to a model folder.

Writes config.json, model.safetensors and tokenizer.model into DST_DIR, all or nothing; a
Hugging Face model without DST_DIR goes into the model cache (see model/hub.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..arguments import ArgumentParser
from ..model import hub
from ..model.config import ModelConfig
from ..model.convert import ConvertError, convert_nemo
from ..model.errors import ModelNotFound


def convert(src: str, dst: Path) -> ModelConfig:
    """A .nemo file, or a hub name (ORG/NAME[@REVISION], small, large, multilingual) downloaded first, into `dst`."""
    path = Path(src)
    if not path.exists() and hub.is_hub_name(src):
        path = hub.download(src)
    return convert_nemo(path, dst, src)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="parakeet-convert", description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a .nemo file, or a Hugging Face model: ORG/NAME[@REVISION], small, large or multilingual")
    ap.add_argument("dst", type=Path, nargs="?",
                    help="output folder, e.g. weights/small (default for a hub model: the model cache, "
                         "refreshed to the revision's newest commit)")
    args = ap.parse_args(argv)
    try:
        if args.dst is None:
            if Path(args.src).exists() or not hub.is_hub_name(args.src):
                ap.error("DST is required when SRC is a .nemo file")
            args.dst = hub.resolve(args.src, refresh=True)
            cfg = ModelConfig.load(args.dst / "config.json")
        else:
            cfg = convert(args.src, args.dst)
    except (ConvertError, ModelNotFound) as exc:
        print(f"parakeet-convert: error: {exc}", file=sys.stderr)
        return 1
    enc = cfg.encoder
    modes = " ".join(f"[{a},{b}]" for a, b in enc.att_context_sizes)
    print(f"wrote {args.dst}: {enc.n_layers} layers x {enc.d_model}, lookahead modes {modes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`demo_model.train --init`: an exported model folder loads back into the trainer exactly."""
from __future__ import annotations

from pathlib import Path

import torch

from parakeet_stream.model.config import ModelConfig
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.training.export import export_model
from parakeet_stream.training.objective import Transducer

DEMO = Path(__file__).resolve().parent.parent / "weights" / "demo"
MEAN, STD = -11.7, 3.5  # the raw log-mel statistics the first conv is normalised by


def trained_like(seed: int) -> Transducer:
    """A trainer whose weights (the normalised first conv included) are random, not default."""
    torch.manual_seed(seed)
    trainer = Transducer(ParakeetModel(ModelConfig.load(DEMO / "config.json")), MEAN, STD)
    with torch.no_grad():
        for p in trainer.parameters():
            p.normal_(0, 0.05)
    trainer.sync()
    return trainer


def test_exported_model_loads_back_into_the_trainer(tmp_path):
    source = trained_like(0)
    export_model(source.model, DEMO / "tokenizer.model", tmp_path)
    target = trained_like(1)
    target.load_exported(tmp_path)

    exported = {k: v.half().float() if not k.startswith("features.") else v
                for k, v in source.model.state_dict().items()}
    for name, value in target.model.state_dict().items():
        torch.testing.assert_close(value, exported[name], rtol=0, atol=1e-6, msg=name)
    # the optimiser's view of the first conv maps back to the same raw-space conv
    for mine, theirs in zip(target.raw_conv0(), source.raw_conv0()):
        torch.testing.assert_close(mine, theirs.half().float(), rtol=1e-3, atol=1e-4)
    feats = torch.randn(2, 300, 80) * STD + MEAN
    lengths = torch.tensor([300, 211])
    with torch.no_grad():
        ours, _ = target.model.encoder(feats, lengths)
        reference = ParakeetModel.from_dir(tmp_path).eval().encoder(feats, lengths)[0]
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)

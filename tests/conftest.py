"""Shared fixtures: tiny NeMo-made models converted with parakeet-convert, and test audio."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parakeet_stream.audio import read_audio
from parakeet_stream.tools.convert import convert
from parakeet_stream.model.parakeet import ParakeetModel

FIXTURES = Path(__file__).parent / "fixtures"
NEMO = FIXTURES / "nemo"
AUDIO = FIXTURES / "audio"


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> dict[str, Path]:
    """Both tiny NeMo fixture models converted once per session: name -> model folder."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name in ("eou_tiny", "nemotron_tiny"):
        convert(str(NEMO / f"{name}.nemo"), root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(converted) -> Path:
    return converted["eou_tiny"]


@pytest.fixture(scope="session")
def eou_model(converted) -> ParakeetModel:
    return ParakeetModel.from_dir(converted["eou_tiny"])


@pytest.fixture(scope="session")
def nemotron_model(converted) -> ParakeetModel:
    return ParakeetModel.from_dir(converted["nemotron_tiny"])


@pytest.fixture(scope="session")
def wavs() -> dict[str, np.ndarray]:
    return {p.stem: read_audio(p) for p in sorted(AUDIO.glob("*.wav"))}


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads((NEMO / "reference.json").read_text())


@pytest.fixture(scope="session")
def reference_tensors() -> dict:
    from safetensors.torch import load_file

    return load_file(str(NEMO / "reference.safetensors"))


@pytest.fixture(scope="session")
def reference_fb(eou_model):
    """The mel filterbank NeMo stored in the fixture checkpoint (computed by librosa)."""
    return eou_model.features.fb

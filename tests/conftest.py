"""Shared fixtures: tiny NeMo-made models converted with parakeet-convert, test audio, and the
engine and sentence the server tests share (one engine per test module)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import engine_reached, pcm16_exact, run_stream, tokens_of

from parakeet_stream.audio import read_audio
from parakeet_stream.engine import ASREngine
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
def prompt_model_dir(tmp_path_factory) -> Path:
    """The multilingual family's tiny fixture (language prompts: en-US, es-ES, de-DE, auto), converted."""
    folder = tmp_path_factory.mktemp("models") / "prompt_tiny"
    convert(str(NEMO / "prompt_tiny.nemo"), folder)
    return folder


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


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with ASREngine(tiny_model_dir, max_num_streams=4, max_queue=4) as e:
        yield e


@pytest.fixture(scope="module", params=["in-process", "engine-process"])
def either_engine(request, tiny_model_dir):
    """The module's engine in this process, then the same behind the engine client API (as a
    worker process of `parakeet-serve --workers N` reaches it): a module that names its `engine`
    this runs every test both ways."""
    with engine_reached(request.param, tiny_model_dir, max_num_streams=4, max_queue=4) as e:
        yield e


@pytest.fixture(scope="module")
def sentence(wavs) -> np.ndarray:
    """The fixture sentence, exactly representable in PCM16 (so every encoding sends the same samples)."""
    return pcm16_exact(wavs["sentence"])


@pytest.fixture(scope="module")
def solo_tokens(engine, sentence) -> list[int]:
    """What the engine alone transcribes for the sentence (the reference for every transport)."""
    return tokens_of(run_stream(engine, sentence))

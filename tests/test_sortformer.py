"""Streaming Sortformer (model/sortformer*.py) against NeMo's own streaming inference.

The references come from tests/fixtures/nemo/make_sortformer_fixture.py: a tiny random-init NeMo
SortformerEncLabelModel with the structure of nvidia/diar_streaming_sortformer_4spk-v2, streamed by
NeMo (async and synchronous speaker-cache updates) over the test wavs for several chunk / context /
FIFO / speaker-cache settings. NeMo is not needed here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file

from parakeet_stream.model.config import UnsupportedModel
from parakeet_stream.model.convert import ConvertError
from parakeet_stream.model.sortformer import Sortformer
from parakeet_stream.model.sortformer_streaming import StreamingSortformer, stream_features

FIXTURES = Path(__file__).parent / "fixtures"
NEMO = FIXTURES / "nemo"
ATOL = 1e-4

INFO = json.loads((NEMO / "sortformer_reference.json").read_text())
SETTINGS = {s["name"]: s for s in INFO["settings"]}
CASES = sorted({tuple(key.split("/")[:2]) for key in INFO["records"]})


@pytest.fixture(scope="module")
def model() -> Sortformer:
    torch.manual_seed(0)
    return Sortformer.from_nemo(NEMO / "sortformer_tiny.nemo")


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return load_file(str(NEMO / "sortformer_reference.safetensors"))


@pytest.fixture(scope="module")
def features(model) -> dict[str, torch.Tensor]:
    audio = {}
    for wav in ("sentence", "pause", "noise"):
        samples, rate = sf.read(FIXTURES / "audio" / f"{wav}.wav", dtype="float32")
        assert rate == model.cfg.features.sample_rate
        audio[wav] = samples
    audio["all"] = np.concatenate([audio["sentence"], audio["pause"], audio["noise"]])
    assert {w: a.size for w, a in audio.items()} == INFO["samples"]
    with torch.no_grad():
        return {w: model.features(torch.from_numpy(a))[0] for w, a in audio.items()}


def runner(model, setting: str, mode: str) -> StreamingSortformer:
    s = SETTINGS[setting]
    cfg = dataclasses.replace(model.cfg.streaming, **{k: v for k, v in s.items() if k != "name"})
    return StreamingSortformer(model, cfg, sync_first_compress=mode == "sync")


@pytest.mark.parametrize("setting,mode", CASES)
def test_streaming_matches_nemo(model, reference, features, setting, mode):
    run = runner(model, setting, mode)
    for wav, feats in features.items():
        key = f"{setting}/{mode}/{wav}"
        want = reference[key]
        chunks = list(run.chunks(feats.size(0)))
        assert len(chunks) == len(INFO["records"][key]["steps"]), key
        got = stream_features(run, [feats])[0]
        assert got.shape == want.shape, key
        err = (got - want).abs().max().item()
        print(f"{key}: max |ours - NeMo| = {err:.1e}")
        assert err < ATOL, f"{key}: max |ours - NeMo| = {err:.2e}"
        assert torch.equal(got > 0.5, want > 0.5), f"{key}: speaker decisions differ"


def test_reference_exercises_the_cache():
    """The fixture is only a test of the cache logic if NeMo's runs compressed the speaker cache,
    recorded silence and made both speaker decisions."""
    records = INFO["records"]
    assert sum(r["compressed"] for r in records.values()) >= len(records) // 2
    assert sum(r["steps"][-1]["n_sil_frames"] > 0 for r in records.values()) >= len(records) // 2
    assert 0.1 < INFO["quality"]["active_fraction"] < 0.9


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_batched_equals_alone(model, features, mode):
    """Streams of different lengths stepped together give each one's result alone."""
    run = runner(model, CASES[0][0], mode)
    names = ["pause", "sentence", "noise", "all"]
    alone = {w: stream_features(run, [features[w]])[0] for w in names}
    together = stream_features(run, [features[w] for w in names])
    for w, got in zip(names, together):
        assert got.shape == alone[w].shape
        assert (got - alone[w]).abs().max().item() < ATOL, w  # rounding of other batch shapes, amplified by the wide logits
        assert torch.equal(got > 0.5, alone[w] > 0.5), w


def test_cache_and_fifo_stay_in_bounds(model, features):
    run = runner(model, "c4_l2_r2_f8_s20", "async")
    state = run.init_state(1)
    feats = features["all"]
    for start, end, left, right in run.chunks(feats.size(0)):
        run.step(state, feats[start:end].unsqueeze(0), torch.tensor([end - start]), torch.tensor([left]), torch.tensor([right]))
        assert 0 <= int(state.spkcache_lengths) <= run.cfg.spkcache_len
        assert 0 <= int(state.fifo_lengths) <= run.cfg.fifo_len
    assert bool(state.compressed) and int(state.n_sil_frames) > 0


@pytest.mark.parametrize("change", [dict(spkcache_sil_frames_per_spk=2), dict(scores_boost_latest=0.0), dict(sil_threshold=0.0)])
def test_parity_sees_the_cache_rules(model, reference, features, change):
    """The references pin the speaker-cache rules down: changing one of them moves some output."""
    setting, mode = "c4_l2_r2_f8_s20", "async"
    run = runner(model, setting, mode)
    run.cfg = dataclasses.replace(run.cfg, **change)
    worst = max((stream_features(run, [features[w]])[0] - reference[f"{setting}/{mode}/{w}"]).abs().max().item()
                for w in features)
    assert worst > 100 * ATOL


def test_a_file_that_is_no_diarizer_is_refused_with_the_reason(tmp_path):
    (tmp_path / "notes.nemo").write_text("not an archive")
    with pytest.raises(ConvertError, match="not a .nemo archive"):
        Sortformer.from_nemo(tmp_path / "notes.nemo")
    with pytest.raises(ConvertError, match="no such file"):
        Sortformer.from_nemo(tmp_path / "missing.nemo")
    with pytest.raises(UnsupportedModel, match="dw_striding"):  # a recogniser, not a diarizer
        Sortformer.from_nemo(NEMO / "eou_tiny.nemo")

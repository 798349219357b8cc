"""Token-exact parity with NeMo's own cache-aware streaming (fixtures from tests/fixtures/nemo/make_nemo_fixtures.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import collect_until_final, cut_whole, run_stream, tokens_of

from parakeet_stream.model.conformer import EncoderCache
from parakeet_stream.engine import ASREngine

CASES = [
    ("eou_tiny", wav, mode) for wav in ("sentence", "pause", "noise") for mode in ("70,1",)
] + [("nemotron_tiny", wav, mode) for wav in ("sentence", "pause", "noise") for mode in ("70,13", "70,6", "70,1", "70,0")]


def mode_of(text: str) -> tuple[int, int]:
    left, right = text.split(",")
    return int(left), int(right)


@pytest.fixture(scope="module")
def models(eou_model, nemotron_model):
    return {"eou_tiny": eou_model, "nemotron_tiny": nemotron_model}


@pytest.fixture(scope="module")
def engines(models):
    engines = {name: ASREngine(m, max_num_streams=4).start() for name, m in models.items()}
    yield engines
    for e in engines.values():
        e.shutdown()


@torch.inference_mode()
def stream_encoder(model, audio, lookahead) -> torch.Tensor:
    """Encoder outputs of one stream, chunk by chunk, through the engine's own chunking code."""
    cache = EncoderCache.zeros(model.cfg.encoder, 1)
    outs = []
    for frames, start, length in cut_whole(model, [audio], lookahead)[0]:
        x, lens = model.encoder.stream_pre_encode(torch.from_numpy(frames[None]), torch.tensor([length]),
                                                  torch.tensor([start]), lookahead)
        enc = model.encoder.stream_layers(x, lens, cache, torch.tensor([0]), lookahead)
        outs.append(enc[0, : lens[0]])
    return torch.cat(outs)


@pytest.mark.parametrize("name,wav,mode", CASES)
def test_streaming_tokens_equal_nemo(engines, reference, wavs, name, wav, mode):
    ref = reference["models"][name]["runs"][wav][mode]
    results = run_stream(engines[name], wavs[wav], mode_of(mode))
    assert tokens_of(results) == ref["stream_tokens"]
    per_chunk = [r.token_ids for r in results if r.latency is not None]
    assert per_chunk == [c["new_tokens"] for c in ref["chunks"]]


@pytest.mark.parametrize("name,wav,mode", CASES)
def test_streaming_encoder_output_close_to_nemo(models, reference_tensors, wavs, name, wav, mode):
    nemo = reference_tensors[f"{name}/{wav}/{mode}/stream_encoded"].T
    ours = stream_encoder(models[name], wavs[wav], mode_of(mode))
    assert ours.shape == nemo.shape
    assert (ours - nemo).abs().max().item() < 1e-4


@pytest.mark.parametrize("name,wav,mode", CASES)
def test_offline_matches_nemo_and_streaming(models, reference, reference_tensors, wavs, name, wav, mode):
    model, ref = models[name], reference["models"][name]["runs"][wav][mode]
    with torch.inference_mode():
        feats, valid = model.features(torch.from_numpy(wavs[wav]))
        enc, enc_len = model.encoder(feats[None], torch.tensor([valid]), mode_of(mode))
        emission, _ = model.decoder.decode(enc, enc_len, model.decoder.initial_state(1))
    nemo = reference_tensors[f"{name}/{wav}/{mode}/offline_encoded"].T
    assert (enc[0, : enc_len[0]] - nemo).abs().max().item() < 1e-4
    assert emission.token == ref["offline_tokens"]
    if ref["stream_equals_offline"]:
        assert emission.token == ref["stream_tokens"]


def test_batch_of_streams_decodes_as_each_alone(engines, wavs):
    engine = engines["nemotron_tiny"]
    solo = {w: tokens_of(run_stream(engine, a, (70, 1))) for w, a in wavs.items()}
    sids = {w: engine.create_stream((70, 1)) for w in wavs}
    for w, a in wavs.items():
        engine.push_audio(sids[w], a)
        engine.finalize(sids[w])

    assert {w: tokens_of(collect_until_final(engine, s)) for w, s in sids.items()} == solo


def test_fixture_margins_are_wide(reference):
    assert reference["min_margin_overall"] > 0.05

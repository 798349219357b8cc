"""The multilingual family (language-ID prompts, nemotron-3.5-asr): token-exact parity with NeMo's
cache-aware streaming for every lookahead mode and every prompt, streams of different languages in
one batch, and the language tags the model writes (fixtures from
`tests/fixtures/nemo/make_nemo_fixtures.py --family prompt_tiny`)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import NEMO
from helpers import cut_whole

from parakeet_stream.model.config import ModelConfig
from parakeet_stream.model.conformer import EncoderCache
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.tokenizer import IncrementalDetokenizer, split_language_tags
from parakeet_stream.tools.convert import convert

REFERENCE = json.loads((NEMO / "prompt_reference.json").read_text())
FIXTURE = REFERENCE["models"]["prompt_tiny"]
PROMPTS = list(FIXTURE["prompts"])
MODES = [f"{left},{right}" for left, right in FIXTURE["modes"]]
WAVS = REFERENCE["wavs"]
CASES = [(prompt, wav, mode) for prompt in PROMPTS for wav in WAVS for mode in MODES]


def mode_of(text: str) -> tuple[int, int]:
    left, right = text.split(",")
    return int(left), int(right)


def run_of(prompt: str, wav: str, mode: str) -> dict:
    return FIXTURE["prompts"][prompt]["runs"][wav][mode]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "prompt_tiny"
    convert(str(NEMO / FIXTURE["nemo_file"]), folder)
    return folder


@pytest.fixture(scope="module")
def model(model_dir) -> ParakeetModel:
    return ParakeetModel.from_dir(model_dir)


@pytest.fixture(scope="module")
def tensors() -> dict:
    from safetensors.torch import load_file

    return load_file(str(NEMO / "prompt_reference.safetensors"))


@torch.inference_mode()
def stream(model: ParakeetModel, audios: list[np.ndarray], prompts: list[str], lookahead) -> list[dict]:
    """Our streaming decode of streams in one batch, chunk by chunk: the engine's chunker, the
    cache-aware encoder step, each row's language prompt, one greedy pass per step with the
    decoder state carried. Per stream: the tokens of each chunk, the encoder output and what the
    joint saw ([T, D], chunks joined)."""
    chunks = cut_whole(model, audios, lookahead)
    index = torch.tensor([model.cfg.prompt.index(p) for p in prompts])
    cache = EncoderCache.zeros(model.cfg.encoder, len(audios))
    state = model.decoder.state_pool(len(audios))
    out = [{"chunks": [], "encoded": [], "joint": []} for _ in audios]
    for step in range(max(map(len, chunks))):
        rows = [b for b in range(len(audios)) if step < len(chunks[b])]  # streams with a chunk left
        windows = [chunks[b][step] for b in rows]
        slots = torch.tensor(rows)
        x, lens = model.encoder.stream_pre_encode(
            torch.from_numpy(np.stack([frames for frames, _, _ in windows])), torch.tensor([n for _, _, n in windows]),
            torch.tensor([start for _, start, _ in windows]), lookahead)
        enc = model.encoder.stream_layers(x, lens, cache, slots, lookahead)
        joint = model.prompted(enc, index[slots])
        emission, after = model.decoder.decode(joint, lens, state.gather(slots))
        state.scatter(slots, after)
        for i, (b, found) in enumerate(zip(rows, emission.per_stream(len(rows)))):
            out[b]["chunks"].append([token for token, _ in found])
            out[b]["encoded"].append(enc[i, : lens[i]])
            out[b]["joint"].append(joint[i, : lens[i]])
    for o in out:
        o["encoded"], o["joint"] = torch.cat(o["encoded"]), torch.cat(o["joint"])
    return out


@pytest.mark.parametrize("prompt,wav,mode", CASES)
def test_streaming_tokens_equal_nemo(model, tensors, wavs, prompt, wav, mode):
    ref = run_of(prompt, wav, mode)
    (ours,) = stream(model, [wavs[wav]], [prompt], mode_of(mode))
    assert ours["chunks"] == [c["new_tokens"] for c in ref["chunks"]]
    assert sum(ours["chunks"], []) == ref["stream_tokens"]
    # the encoder output before the prompt, and what the joint sees after it
    nemo_encoded = tensors[f"prompt_tiny/{wav}/{mode}/stream_encoder_out"].T
    nemo_joint = tensors[f"prompt_tiny/{prompt}/{wav}/{mode}/stream_encoded"].T
    assert ours["joint"].shape == nemo_joint.shape
    assert (ours["encoded"] - nemo_encoded).abs().max().item() < 1e-4
    assert (ours["joint"] - nemo_joint).abs().max().item() < 1e-4


@pytest.mark.parametrize("prompt,wav,mode", CASES)
def test_offline_equals_nemo(model, tensors, wavs, prompt, wav, mode):
    ref = run_of(prompt, wav, mode)
    with torch.inference_mode():
        feats, valid = model.features(torch.from_numpy(wavs[wav]))
        enc, enc_len = model.encoder(feats[None], torch.tensor([valid]), mode_of(mode))
        joint = model.prompted(enc, torch.tensor([model.cfg.prompt.index(prompt)]))
        emission, _ = model.decoder.decode(joint, enc_len, model.decoder.initial_state(1))
    nemo = tensors[f"prompt_tiny/{prompt}/{wav}/{mode}/offline_encoded"].T
    assert (joint[0, : enc_len[0]] - nemo).abs().max().item() < 1e-4
    assert emission.token == ref["offline_tokens"]


@pytest.mark.parametrize("mode", MODES)
def test_a_batch_of_mixed_languages_decodes_each_stream_as_alone(model, wavs, mode):
    """Every wav in every language in one batch (streams of different lengths, so rows drop out
    as they end): each row gets exactly NeMo's tokens for its wav and prompt alone."""
    rows = [(wav, prompt) for wav in WAVS for prompt in PROMPTS]
    out = stream(model, [wavs[wav] for wav, _ in rows], [prompt for _, prompt in rows], mode_of(mode))
    for (wav, prompt), ours in zip(rows, out):
        assert ours["chunks"] == [c["new_tokens"] for c in run_of(prompt, wav, mode)["chunks"]], (wav, prompt)


def test_every_prompt_changes_the_transcript_with_wide_margins():
    """What makes the tests above able to fail: no two prompts decode any utterance alike, and
    every greedy decision NeMo made is won by a clear logit margin."""
    for wav in WAVS:
        for mode in MODES:
            decoded = [tuple(run_of(p, wav, mode)["stream_tokens"]) for p in PROMPTS]
            assert len(set(decoded)) == len(PROMPTS), (wav, mode)
    assert REFERENCE["min_margin_overall"] > 0.05
    assert len(PROMPTS) >= 3 and "auto" in PROMPTS and len(MODES) == 5


def test_language_tags_decode_and_strip_as_nemo(model):
    tokenizer = model.tokenizer
    assert tokenizer.language_tags == {i: tag[1:-1] for tag, i in FIXTURE["language_tags"].items()}
    assert set(tokenizer.language_tags) <= tokenizer.special_ids
    tags_seen = 0
    for prompt, wav, mode in CASES:
        ref = run_of(prompt, wav, mode)
        tags = [tokenizer.language_tags[t] for t in ref["stream_tokens"] if t in tokenizer.language_tags]
        tags_seen += len(tags)
        # NeMo's text keeps the tags (its default); split off as its strip_lang_tags does, they are
        # the tag tokens' languages
        assert split_language_tags(ref["text"]) == (ref["text_stripped"], tags)
        # our text never has them: NeMo's tokenizer text with the tags split off, whole or chunk by
        # chunk (up to the ends, which strip_lang_tags strips; NeMo's decoding also drops a space
        # before punctuation, a rule of its own for every model, not about tags)
        without_tags = split_language_tags(ref["tokenizer_text"])[0]
        assert tokenizer.decode(ref["stream_tokens"]).strip() == without_tags
        detok = IncrementalDetokenizer(tokenizer)
        assert ("".join(detok.push(c["new_tokens"]) for c in ref["chunks"]) + detok.flush()).strip() == without_tags
    assert tags_seen > 0


def test_split_language_tags_follows_nemos_pattern():
    assert split_language_tags("Hola, ¿qué tal?<es-ES> Bien. <es-ES>") == ("Hola, ¿qué tal? Bien.", ["es-ES", "es-ES"])
    assert split_language_tags("  plain text ") == ("plain text", [])
    assert split_language_tags("<auto> <en-us> <EOU>") == ("<auto> <en-us> <EOU>", [])  # not locale tags


def test_prompt_config_from_nemo_and_config_json(model, model_dir, converted):
    prompt = model.cfg.prompt
    assert prompt.num_prompts == FIXTURE["num_prompts"]
    assert prompt.languages == FIXTURE["prompt_dictionary"]
    assert ModelConfig.load(model_dir / "config.json") == model.cfg
    with pytest.raises(ValueError, match="unknown language 'xx-XX'.*en-US"):
        prompt.index("xx-XX")
    # models without prompts: no prompt kernel, config.json as before, and nothing to condition
    for name in ("eou_tiny", "nemotron_tiny"):
        assert "prompt" not in json.loads((converted[name] / "config.json").read_text())
        plain = ParakeetModel.from_dir(converted[name])
        assert plain.cfg.prompt is None and plain.prompt is None
        enc = torch.zeros(1, 2, plain.cfg.encoder.d_model)
        assert plain.prompted(enc, None) is enc
        with pytest.raises(ValueError, match="no language prompts"):
            plain.prompted(enc, torch.tensor([0]))


def test_without_a_prompt_the_encoder_output_is_left_as_is(model):
    """NeMo skips the projection until set_inference_prompt; prompts=None does the same."""
    enc = torch.randn(2, 3, model.cfg.encoder.d_model, generator=torch.Generator().manual_seed(0))
    assert model.prompted(enc, None) is enc
    mixed = model.prompted(enc, torch.tensor([0, 7]))
    # a row's projection alone or beside another: float32 sums in another order (1e-6 of values near 1)
    assert torch.allclose(mixed[0], model.prompted(enc[:1], torch.tensor([0]))[0], atol=1e-5)
    assert not torch.allclose(mixed[1], model.prompted(enc[1:], torch.tensor([0]))[0])

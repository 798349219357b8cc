"""A language per stream through the real ASREngine (the multilingual family, prompt_tiny): each
stream of a batch of streams in different languages and lookahead modes gets NeMo's tokens for
its language alone, results carry the language (auto: the one the model writes), and a language
the model does not have is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import AUDIO, NEMO
from helpers import collect_until_final, engine_reached, run_stream, tokens_of

from parakeet_stream.engine import ASREngine, EngineError
from parakeet_stream.engine.languages import Languages
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.tools.transcribe import main as transcribe_main
from parakeet_stream.tools.transcribe import transcribe_offline

REFERENCE = json.loads((NEMO / "prompt_reference.json").read_text())
FIXTURE = REFERENCE["models"]["prompt_tiny"]
PROMPTS = list(FIXTURE["prompts"])  # en-US, es-ES, de-DE, auto
TAGS = {i: tag[1:-1] for tag, i in FIXTURE["language_tags"].items()}


def nemo_tokens(prompt: str, wav: str, mode: tuple[int, int]) -> list[int]:
    return FIXTURE["prompts"][prompt]["runs"][wav][f"{mode[0]},{mode[1]}"]["stream_tokens"]


@pytest.fixture(scope="module", params=["in-process", "engine-process", "static-batches"])
def engine(request, prompt_model_dir):
    """In this process, behind the engine client API, and replaying static batches (the CUDA
    graphs' eager stand-in on CPU: the prompt pool read inside the captured encoder step)."""
    if request.param == "static-batches":
        with ASREngine(prompt_model_dir, max_num_streams=12, cuda_graphs=True) as e:
            assert e.runner.graphs and e.runner.prompts is not None
            yield e
        return
    with engine_reached(request.param, prompt_model_dir, max_num_streams=12) as e:
        yield e


def stream(engine, audio: np.ndarray, language=None, lookahead=None, packet: int = 2560) -> int:
    sid = engine.create_stream(lookahead, language=language)
    for i in range(0, len(audio), packet):
        engine.push_audio(sid, audio[i : i + packet])
    engine.finalize(sid)
    return sid


def test_each_language_alone_gives_nemos_tokens(engine, wavs):
    mode = engine.info.default_lookahead
    for prompt in PROMPTS:
        sid = stream(engine, wavs["sentence"], prompt)
        assert tokens_of(collect_until_final(engine, sid)) == nemo_tokens(prompt, "sentence", mode), prompt


def test_a_batch_of_four_languages_and_modes_decodes_each_stream_as_alone(engine, wavs):
    """Twelve streams (every wav in every language, modes mixed) pushed together in packets: each
    gets exactly the tokens it gets alone, which are NeMo's for its language and mode."""
    modes = engine.info.lookahead_modes
    rows = [(wav, prompt, modes[i % len(modes)]) for i, (wav, prompt) in
            enumerate((wav, prompt) for wav in ("sentence", "pause", "noise") for prompt in PROMPTS)]
    sids = [engine.create_stream(mode, language=prompt) for _, prompt, mode in rows]
    audios = [wavs[wav] for wav, _, _ in rows]
    for start in range(0, max(map(len, audios)), 1600):
        for sid, audio in zip(sids, audios):
            if start < len(audio):
                engine.push_audio(sid, audio[start : start + 1600])
    for sid in sids:
        engine.finalize(sid)
    together = [tokens_of(collect_until_final(engine, sid)) for sid in sids]
    for (wav, prompt, mode), tokens in zip(rows, together):
        assert tokens == nemo_tokens(prompt, wav, mode), (wav, prompt, mode)


def test_results_carry_the_language_and_auto_detects(engine, wavs):
    for prompt in ("en-US", "de-DE"):
        results = collect_until_final(engine, stream(engine, wavs["sentence"], prompt))
        assert {r.language for r in results} == {prompt}
    results = collect_until_final(engine, stream(engine, wavs["sentence"], "auto"))
    tokens = nemo_tokens("auto", "sentence", engine.info.default_lookahead)
    written = [TAGS[t] for t in tokens if t in TAGS]
    assert written, "the fixture's auto prompt should write a language tag"
    first = next(i for i, r in enumerate(results) if any(t in TAGS for t in r.token_ids))
    assert all(r.language is None for r in results[:first])  # nothing detected yet
    assert results[first].language is not None and results[-1].language == written[-1]
    assert not any("<" in r.text for r in results)  # tags are never text


def test_a_stream_without_a_language_gets_automatic_language_id(engine, wavs):
    assert engine.info.languages == tuple(PROMPTS) and engine.info.default_language == "auto"
    sid = stream(engine, wavs["pause"])
    assert tokens_of(collect_until_final(engine, sid)) == nemo_tokens("auto", "pause", engine.info.default_lookahead)


def test_language_names_as_clients_write_them(engine, wavs):
    """A bare language takes its first locale; case and '_' do not matter."""
    want = nemo_tokens("es-ES", "noise", engine.info.default_lookahead)
    for name in ("es", "ES_es"):
        results = collect_until_final(engine, stream(engine, wavs["noise"], name))
        assert tokens_of(results) == want and results[-1].language == "es-ES"


@pytest.mark.parametrize("language", ["fr-FR", "xx", "", "multi"])
def test_an_unknown_language_is_refused(engine, language):
    with pytest.raises(EngineError) as refused:
        engine.create_stream(language=language)
    assert refused.value.code == "unsupported_language"
    assert "en-US, es-ES, de-DE, auto" in refused.value.message
    assert engine.stats()["active"] == 0


def test_a_model_without_prompts_takes_english_only(tiny_model_dir, wavs):
    with ASREngine(tiny_model_dir, max_num_streams=2) as engine:
        assert engine.info.languages == () and engine.info.default_language is None
        alone = run_stream(engine, wavs["sentence"])
        for name in ("en", "en-US", "en_gb"):
            results = collect_until_final(engine, stream(engine, wavs["sentence"], name))
            assert tokens_of(results) == tokens_of(alone) and {r.language for r in results} == {None}
        for name in ("de-DE", "auto"):
            with pytest.raises(EngineError, match="transcribes English") as refused:
                engine.create_stream(language=name)
            assert refused.value.code == "unsupported_language"
        assert engine.runner.prompts is None


def test_languages_resolve(engine):
    languages = Languages(("en-US", "en-GB", "de-DE"))
    assert languages.default == "en-US"  # no auto prompt: the first
    assert [languages.resolve(n) for n in (None, "en", "EN-gb", "de")] == ["en-US", "en-US", "en-GB", "de-DE"]
    assert Languages().resolve(None) is None and Languages().resolve("en-AU") is None
    assert engine.check_language("de") == "de-DE" and engine.check_language(None) == "auto"
    with pytest.raises(EngineError, match="expected one of"):
        engine.check_language("fr")


def test_parakeet_transcribe_language(prompt_model_dir, wavs, capsys):
    """--language, streaming (the engine) and --offline (NeMo's offline tokens for that prompt)."""
    model = ParakeetModel.from_dir(prompt_model_dir)
    mode = FIXTURE["default_mode"]
    offline = transcribe_offline(model, {"sentence": wavs["sentence"]}, tuple(mode), "de-DE")["sentence"]
    assert offline.token_ids == FIXTURE["prompts"]["de-DE"]["runs"]["sentence"][f"{mode[0]},{mode[1]}"]["offline_tokens"]
    sentence = str(AUDIO / "sentence.wav")
    assert transcribe_main([sentence, "--model", str(prompt_model_dir), "--json", "--language", "es"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["language"] == "es-ES" and out["token_ids"]
    assert transcribe_main([sentence, "--model", str(prompt_model_dir), "--language", "fr"]) == 2
    assert "--language: language 'fr': expected one of" in capsys.readouterr().err

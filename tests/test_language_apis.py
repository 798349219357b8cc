"""A stream's language on every API, with the multilingual family's tiny model (prompt_tiny:
en-US, es-ES, de-DE, auto): each API's own field gives the transcript the native protocol gives in
that language (and the languages' transcripts differ, so a field that did not reach the engine
fails), results carry the language where the API has a field, and a language the model lacks is
refused in the API's own error shape, over real sockets and through each API's official client."""
from __future__ import annotations

import grpc
import pytest
import riva.client as riva_client
import test_deepgram as dg
import test_openai_realtime as oai
import test_riva as rv
import test_uploads_deepgram as dg_files
import test_uploads_openai as oai_files
import trio
from helpers import (Raw, audio_file, audio_messages, collect_until_final, multipart, openai_error, pcm16_b64, post,
                     refused_handshake, running_server, url)

from parakeet_stream.client import encode_audio, transcribe_async
from parakeet_stream.engine import ASREngine

LANGUAGES = ("en-US", "es-ES", "de-DE", "auto")


@pytest.fixture(scope="module")
def engine(prompt_model_dir):
    with ASREngine(prompt_model_dir, max_num_streams=4, max_queue=4) as e:
        yield e


async def native(ctx, samples, kind: str = "ws", path: str = "/", **start) -> list[dict]:
    """Every message of a native stream: a start message with `start`'s fields, the audio, its end."""
    async with Raw.open(url(ctx, kind, path)) as conn:
        await conn.send({"type": "start", **start})
        for message in audio_messages(samples):
            await conn.send(message)
        return await conn.until("result", is_final=True)


def text_of(messages: list[dict]) -> str:
    return " ".join(messages[-1]["text"].split())


@pytest.fixture(scope="module")
def texts(engine, sentence) -> dict[str, str]:
    """The engine's transcript of the sentence in each language: what every API must give."""
    out = {}
    for language in LANGUAGES:
        sid = engine.create_stream(language=language)
        engine.push_audio(sid, sentence)
        engine.finalize(sid)
        out[language] = " ".join("".join(r.text for r in collect_until_final(engine, sid)).split())
    assert len(set(out.values())) == len(LANGUAGES) and all(out.values())
    return out


# -- native (TCP and WebSocket) ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_native_start_language_is_echoed_and_carried_by_results(engine, sentence, texts, kind):
    async with running_server(engine) as ctx:
        messages = await native(ctx, sentence, kind, language="de")
    started = next(m for m in messages if m["type"] == "started")
    results = [m for m in messages if m["type"] == "result"]
    assert started["language"] == "de-DE" and started["protocol_version"] == 6
    assert {r["language"] for r in results} == {"de-DE"} and text_of(messages) == texts["de-DE"]


async def test_native_auto_is_the_default_and_results_say_what_the_model_wrote(engine, sentence, texts):
    async with running_server(engine) as ctx:
        messages = await native(ctx, sentence)
        by_url = await native(ctx, sentence, path="/?language=es_ES")
    assert next(m for m in messages if m["type"] == "started")["language"] == "auto"
    detected = [m["language"] for m in messages if m["type"] == "result" and m["language"]]
    assert detected and set(detected) <= {"en-US", "es-ES", "de-DE"} and text_of(messages) == texts["auto"]
    assert next(m for m in by_url if m["type"] == "hello")["language"] == "es-ES"
    assert text_of(by_url) == texts["es-ES"]


async def test_the_python_client_names_the_language(engine, sentence, texts):
    async with running_server(engine) as ctx:
        transcript = await transcribe_async(url(ctx, "tcp"), sentence, language="es")
    assert " ".join(transcript.text.split()) == texts["es-ES"] and transcript.results[-1]["language"] == "es-ES"


async def test_native_unknown_language_is_refused(engine):
    async with running_server(engine) as ctx:
        for kind, start in [("tcp", {"language": "fr-FR"}), ("ws", {"language": "klingon"}), ("tcp", {"language": 5})]:
            async with Raw.open(url(ctx, kind)) as conn:
                await conn.send({"type": "start", **start})
                errors = [m for m in await conn.rest() if m["type"] == "error"]
            code = "invalid_config" if start["language"] == 5 else "unsupported_language"
            assert [e["code"] for e in errors] == [code], errors
        async with Raw.open(url(ctx, "ws", "/?language=fr")) as conn:
            errors = [m for m in await conn.rest() if m["type"] == "error"]
        assert errors[0]["code"] == "unsupported_language" and "en-US, es-ES, de-DE, auto" in errors[0]["message"]
        assert conn.close_code == 1008
        assert engine.stats()["active"] == 0


async def test_english_models_take_english_and_refuse_other_languages(tiny_model_dir, sentence):
    with ASREngine(tiny_model_dir, max_num_streams=2) as english:
        async with running_server(english) as ctx:
            plain = await native(ctx, sentence)
            named = await native(ctx, sentence, language="en-GB")
            async with Raw.open(url(ctx, "tcp")) as conn:
                await conn.send({"type": "start", "language": "de-DE"})
                errors = [m for m in await conn.rest() if m["type"] == "error"]
    assert text_of(plain) == text_of(named) and {m.get("language") for m in named if m["type"] == "result"} == {None}
    assert errors[0]["code"] == "unsupported_language" and "English" in errors[0]["message"]


# -- Deepgram ------------------------------------------------------------------------------------


async def test_deepgram_language_and_multi(engine, sentence, texts):
    pcm = encode_audio(sentence, "pcm16")
    script = dg.send_all_then_close(pcm, 16000, 2)
    async with running_server(engine) as ctx:
        spanish = await dg.in_thread(dg.run_sdk(ctx, script, encoding="linear16", sample_rate=16000, language="es"))
        multi = await dg.in_thread(dg.run_sdk(ctx, script, encoding="linear16", sample_rate=16000, language="multi"))
    assert dg.transcript(spanish) == texts["es-ES"]
    assert all("languages" not in m["channel"]["alternatives"][0] for m in dg.finals(spanish))  # multi only
    assert dg.transcript(multi) == texts["auto"]
    alternatives = [m["channel"]["alternatives"][0] for m in dg.finals(multi)]
    detected = {language for a in alternatives for language in a["languages"]}
    assert detected and detected <= {"en-US", "es-ES", "de-DE"}
    assert {w["language"] for a in alternatives for w in a["words"] if "language" in w} <= detected


async def test_deepgram_unknown_language_fails_the_handshake_in_deepgrams_shape(engine):
    async with running_server(engine) as ctx:
        response = await refused_handshake(
            f"ws://127.0.0.1:{ctx.config.ports['ws']}/v1/listen?encoding=linear16&sample_rate=16000&language=fr")
    assert response.status_code == 400
    assert b'"err_code":"INVALID_QUERY_PARAMETER","err_msg":"language \'fr\'' in response.body


async def test_deepgram_files_language(engine, sentence, texts):
    wav = audio_file(sentence)
    async with running_server(engine) as ctx:
        german = await dg_files.transcribe_file(ctx, wav, language="de")
        multi = await dg_files.transcribe_file(ctx, wav, language="multi")
        error = await dg_files.refused(ctx, lambda media: media.transcribe_file(request=wav, language="xx"))
    assert dg_files.alternative(german)["transcript"] == texts["de-DE"] and "languages" not in dg_files.alternative(german)
    assert dg_files.alternative(multi)["transcript"] == texts["auto"]
    assert set(dg_files.alternative(multi)["languages"]) <= {"en-US", "es-ES", "de-DE"}
    assert error.status_code == 400 and error.body["err_code"] == "INVALID_QUERY_PARAMETER"
    assert "expected one of" in error.body["err_msg"]


# -- OpenAI Realtime and file transcriptions ---------------------------------------------------------


def transcription(**fields) -> dict:
    return {"type": "transcription", "audio": {"input": {"turn_detection": None, "transcription": fields}}}


async def test_openai_realtime_transcription_language(engine, sentence, texts):
    pcm = encode_audio(oai.at_rate(sentence, oai.RATE), "pcm16")
    completed = []

    async def script(session) -> None:
        updated = await session.update(transcription(language="de"))
        assert updated["session"]["audio"]["input"]["transcription"]["language"] == "de"
        completed.append(await session.transcribe(pcm))
        await session.connection.session.update(session=transcription(language="fr"))
        error = await session.until("error")
        assert error["error"]["code"] == "unsupported_language"
        assert error["error"]["param"] == "session.audio.input.transcription.language"
        completed.append(await session.transcribe(pcm))  # still German: the refused update changed nothing
        await session.update(transcription(language="es-ES"))
        completed.append(await session.transcribe(pcm))

    async with running_server(engine) as ctx:
        await oai.in_thread(oai.run_sdk(ctx, script))
    assert [" ".join(c["transcript"].split()) for c in completed] == [texts["de-DE"], texts["de-DE"], texts["es-ES"]]


async def test_openai_files_language(engine, sentence, texts):
    wav = audio_file(sentence)
    async with running_server(engine) as ctx:
        spanish = await oai_files.create(ctx, wav, language="es", response_format="verbose_json")
        detected = await oai_files.create(ctx, wav, response_format="verbose_json")
        refused = await post(ctx.config.ports["http"], oai_files.PATH, multipart({"language": "fr"}, wav), oai_files.FORM)
    assert spanish.text == texts["es-ES"] and spanish.language == "spanish"
    assert detected.text == texts["auto"] and detected.language in ("english", "spanish", "german", "auto")
    error = openai_error(refused, 400, "unsupported_language")
    assert error["param"] == "language" and "expected one of" in error["message"]


# -- NVIDIA Riva ---------------------------------------------------------------------------------------


async def test_riva_language_code_streaming_and_offline(engine, sentence, texts):
    pcm = encode_audio(sentence, "pcm16")

    def run(ctx):
        streamed = rv.stream(ctx, rv.chunks(pcm), rv.streaming_config(language_code="de-DE"))
        offline = rv.service(ctx).offline_recognize(pcm, rv.recognition_config(language_code="es-ES"))
        refused = [rv.rpc_error(lambda: rv.stream(ctx, iter([b"\0\0"]), rv.streaming_config(language_code="fr-FR"))),
                   rv.rpc_error(lambda: rv.service(ctx).offline_recognize(pcm, rv.recognition_config(language_code="xx")))]
        listed = rv.service(ctx).stub.GetRivaSpeechRecognitionConfig(riva_client.proto.riva_asr_pb2.
                                                                     RivaSpeechRecognitionConfigRequest())
        return streamed, offline, refused, listed

    async with running_server(engine) as ctx:
        streamed, offline, refused, listed = await rv.in_thread(run, ctx)
    finals = rv.finals(streamed)
    assert rv.transcript(finals) == texts["de-DE"] and rv.transcript(offline.results) == texts["es-ES"]
    assert {tuple(r.alternatives[0].language_code) for r in finals} == {("de-DE",)}
    assert {w.language_code for r in finals for w in r.alternatives[0].words} == {"de-DE"}
    for error in refused:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "language_code" in error.details()
    assert {c.parameters["language_code"] for c in listed.model_config} == {"en-US,es-ES,de-DE,auto"}


# -- vLLM's realtime API -------------------------------------------------------------------------------


async def vllm(ctx, samples, update: dict | None = None, path: str = "/v1/realtime") -> list[dict]:
    async with Raw.open(url(ctx, "ws", path)) as conn:
        await conn.until("session.created")
        if update is not None:
            await conn.send({"type": "session.update", "session": update})
        for i in range(0, len(samples), 1600):
            await conn.send({"type": "input_audio_buffer.append", "audio": pcm16_b64(samples[i : i + 1600])})
        await conn.send({"type": "input_audio_buffer.commit", "final": True})
        return await conn.until("transcription.done")


async def test_vllm_session_update_and_url_language(engine, sentence, texts):
    async with running_server(engine) as ctx:
        updated = await vllm(ctx, sentence, {"language": "de-DE"})
        by_url = await vllm(ctx, sentence, path="/v1/realtime?language=es")
        async with Raw.open(url(ctx, "ws", "/v1/realtime")) as conn:
            await conn.until("session.created")
            await conn.send({"type": "session.update", "session": {"language": "fr"}})
            errors = [m for m in await conn.rest() if m["type"] == "error"]
    assert " ".join(updated[-1]["text"].split()) == texts["de-DE"]
    assert " ".join(by_url[-1]["text"].split()) == texts["es-ES"]
    assert errors[0]["code"] == "unsupported_language"

"""Deepgram's pre-recorded API, POST /v1/listen on the HTTP port: the official deepgram-sdk's
`listen.v1.media.transcribe_file` (sync client, in a worker thread) against the in-process server."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import trio
from helpers import (
    audio_file,
    post,
    running_server,
    transcribe_raw,
    url,
)

from parakeet_stream.client import encode_audio

pytest.importorskip("deepgram")
from deepgram import DeepgramClient  # noqa: E402
from deepgram.core.api_error import ApiError  # noqa: E402
from deepgram.environment import DeepgramClientEnvironment  # noqa: E402
from deepgram.types.listen_v1response import ListenV1Response  # noqa: E402


def client_for(ctx, key: str = "unused") -> DeepgramClient:
    """The SDK's REST calls pointed at our HTTP port (its `base` URL); live ones use `production`."""
    http = f"http://127.0.0.1:{ctx.config.ports['http']}"
    env = DeepgramClientEnvironment(base=http, production=f"ws://127.0.0.1:{ctx.config.ports['ws']}",
                                    agent="", agent_rest="")
    return DeepgramClient(api_key=key, environment=env)


async def transcribe_file(ctx, data: bytes, key: str = "unused", **params) -> dict:
    def call() -> dict:
        response = client_for(ctx, key).listen.v1.media.transcribe_file(request=data, **params)
        assert isinstance(response, ListenV1Response)
        return response.model_dump(mode="json", exclude_none=True)

    with trio.fail_after(60):
        return await trio.to_thread.run_sync(call)


async def refused(ctx, call) -> ApiError:
    with trio.fail_after(60), pytest.raises(ApiError) as error:
        await trio.to_thread.run_sync(lambda: call(client_for(ctx).listen.v1.media))
    return error.value


def alternative(response: dict) -> dict:
    return response["results"]["channels"][0]["alternatives"][0]


async def test_sdk_transcript_matches_the_streaming_path_with_words_in_order(engine, sentence):
    wav = audio_file(sentence)
    async with running_server(engine) as ctx:
        native = (await transcribe_raw(url(ctx, "ws"), sentence))[-1]["text"].strip()
        response = await transcribe_file(ctx, wav, model="nova-3", smart_format=True, punctuate=True, language="en")
    best = alternative(response)
    assert native and best["transcript"] == native
    words = best["words"]
    assert " ".join(w["word"] for w in words) == native
    assert all(w["punctuated_word"] == w["word"] and 0 < w["confidence"] <= 1 for w in words)
    confidences = [w["confidence"] for w in words]  # the model's (server/streams/words.py): the alternative's is their mean
    assert min(confidences) < 1 and best["confidence"] == pytest.approx(sum(confidences) / len(confidences), abs=1e-3)
    assert all(a["end"] <= b["start"] + 1e-6 and a["start"] <= a["end"] for a, b in zip(words, words[1:]))
    metadata = response["metadata"]
    assert metadata["duration"] == pytest.approx(len(sentence) / 16000, abs=0.01)
    assert metadata["sha256"] == hashlib.sha256(wav).hexdigest()
    assert metadata["channels"] == 1 and metadata["models"] and metadata["request_id"]
    assert "utterances" not in response["results"] and "paragraphs" not in best


async def test_utterances_and_paragraphs_when_asked(engine, wavs):
    """The fixture with a pause holds two utterances (the model's <EOU> ends the first)."""
    pause = wavs["pause"]
    async with running_server(engine) as ctx:
        response = await transcribe_file(ctx, audio_file(pause), utterances=True, paragraphs=True, utt_split=0.8)
    best = alternative(response)
    utterances = response["results"]["utterances"]
    assert len(utterances) >= 2
    # (the same characters: words, like the live protocols', also end at <EOU> where the text may not space them)
    assert "".join(u["transcript"] for u in utterances).replace(" ", "") == best["transcript"].replace(" ", "")
    assert all(u["transcript"] == " ".join(w["word"] for w in u["words"]) for u in utterances)
    assert [w for u in utterances for w in u["words"]] == best["words"]
    assert all(u["channel"] == 0 and u["start"] <= u["end"] and u["id"] for u in utterances)
    paragraphs = best["paragraphs"]["paragraphs"]
    assert [p["sentences"][0]["text"] for p in paragraphs] == [u["transcript"] for u in utterances]


async def test_headerless_audio_with_encoding_and_sample_rate(engine, sentence):
    async with running_server(engine) as ctx:
        wav = alternative(await transcribe_file(ctx, audio_file(sentence)))
        raw = alternative(await transcribe_file(ctx, encode_audio(sentence, "pcm16"), encoding="linear16",
                                                request_options={"additional_query_parameters": {"sample_rate": 16000}}))
    assert raw["transcript"] == wav["transcript"] and raw["words"] == wav["words"]


async def test_urls_callbacks_and_unknown_parameters_are_refused_clearly(engine, sentence):
    wav = audio_file(sentence[:8000])
    async with running_server(engine) as ctx:
        by_url = await refused(ctx, lambda media: media.transcribe_url(url="https://example.com/a.wav"))
        callback = await refused(ctx, lambda media: media.transcribe_file(request=wav, callback="https://example.com"))
        summary = await refused(ctx, lambda media: media.transcribe_file(request=wav, summarize="v2"))
        diarize = await refused(ctx, lambda media: media.transcribe_file(request=wav, diarize=True))
    assert by_url.status_code == 400 and by_url.body["err_code"] == "URL_NOT_SUPPORTED"
    assert "fetches nothing" in by_url.body["err_msg"]
    assert "callbacks are not supported" in callback.body["err_msg"]
    assert summary.body["err_code"] == "INVALID_QUERY_PARAMETER" and "summarize" in summary.body["err_msg"]
    assert diarize.status_code == 400 and "diarize" in diarize.body["err_msg"]
    for error in (by_url, callback, summary, diarize):
        assert set(error.body) == {"err_code", "err_msg", "request_id"}


async def test_bad_audio_too_large_and_wrong_key(engine, sentence):
    async with running_server(engine, max_upload_bytes=64 * 1024, api_key="s3cret") as ctx:
        port = ctx.config.ports["http"]
        auth = {"Authorization": "Token s3cret"}
        junk = await post(port, "/v1/listen", b"not audio at all" * 100, "audio/wav", **auth)
        empty = await post(port, "/v1/listen", b"", "audio/wav", **auth)
        odd = await post(port, "/v1/listen?encoding=linear16&sample_rate=16000", b"\0" * 1001, "audio/l16", **auth)
        large = await post(port, "/v1/listen", audio_file(np.tile(sentence, 2)), "audio/wav", **auth)
        wrong_key = await post(port, "/v1/listen", audio_file(sentence), "audio/wav", Authorization="Token nope")
    assert junk.status == 400 and "not an audio file" in junk.json()["err_msg"]
    assert empty.status == 400 and empty.json()["err_msg"] == "the file is empty"
    assert odd.status == 400 and "multiple of 2 bytes" in odd.json()["err_msg"]
    assert large.status == 413 and large.json()["err_code"] == "PAYLOAD_TOO_LARGE"
    assert wrong_key.status == 401 and wrong_key.json()["err_code"] == "INVALID_AUTH"

"""NVIDIA Riva ASR over gRPC (`--grpc-port`), driven by the official nvidia-riva-client (sync
client, in a worker thread) against the in-process server on loopback, with the demo model.

Every transcript is compared with the native protocol's on the same audio; every response is
the client's own type, re-parsed from its bytes and read by the client's own printers.
"""
from __future__ import annotations

import io
import logging
import struct
import threading
import time

import grpc
import numpy as np
import pytest
import riva.client as riva_client
import soxr
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from riva.client.proto import riva_asr_pb2 as rasr
from riva.client.proto import riva_asr_pb2_grpc as rasr_grpc
from test_server_budgets import good_stream, serve, wait_for, warm_up  # noqa: F401 - serve: a fixture
from helpers import (
    hold_every_slot,
    http_get,
    pcm16_exact,
    result_tokens,
    running_server,
    transcribe_raw,
    url,
    wait_until,
)

from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine
from parakeet_stream.server import ServerConfig
from parakeet_stream.server.cli import build_parser
from parakeet_stream.server.protocols.riva.audio_input import AudioInput
from parakeet_stream.server.protocols.riva.errors import RivaError
from parakeet_stream.server.protocols.riva.options import Options
from parakeet_stream.server.protocols.riva.wav import parse_wav
from parakeet_stream.server.streams.guard import connection_bytes
from parakeet_stream.server.streams.wire import ALAW, MULAW


LINEAR_PCM = riva_client.AudioEncoding.LINEAR_PCM
CHUNK_SECONDS = 0.1
SERVICE = "/nvidia.riva.asr.RivaSpeechRecognition/"


@pytest.fixture(scope="module")
def engine():
    with ASREngine("demo", max_num_streams=4, max_queue=4) as e:
        yield e


@pytest.fixture(scope="module")
def sentence(wavs) -> np.ndarray:
    return pcm16_exact(wavs["sentence"])


@pytest.fixture(scope="module")
def pause(wavs) -> np.ndarray:
    """Two espeak sentences with a 1.5 s pause between them."""
    return pcm16_exact(wavs["pause"])


# -- the client, as its users write it ----------------------------------------------------------


def service(ctx, key: str | None = None, function_id: str | None = None) -> riva_client.ASRService:
    """riva.client pointed at our gRPC port, with the metadata Pipecat and LiveKit send to NVCF."""
    metadata = [["function-id", function_id]] if function_id else []
    metadata += [["authorization", f"Bearer {key}"]] if key else []
    auth = riva_client.Auth(uri=f"127.0.0.1:{ctx.config.ports['grpc']}", use_ssl=False, metadata_args=metadata)
    return riva_client.ASRService(auth)


def recognition_config(rate: int = 16000, encoding=LINEAR_PCM, **fields) -> rasr.RecognitionConfig:
    fields.setdefault("language_code", "en-US")
    return riva_client.RecognitionConfig(encoding=encoding, sample_rate_hertz=rate, **fields)


def streaming_config(interim: bool = True, **fields) -> rasr.StreamingRecognitionConfig:
    fields.setdefault("enable_word_time_offsets", True)
    return riva_client.StreamingRecognitionConfig(config=recognition_config(**fields), interim_results=interim)


def chunks(data: bytes, rate: int = 16000, width: int = 2, pace: float = 0.0):
    step = int(rate * CHUNK_SECONDS) * width
    for i in range(0, len(data), step):
        if pace:
            time.sleep(pace)
        yield data[i : i + step]


def own_type(message, kind):
    """The message as the client's own type, re-parsed strictly from its bytes."""
    assert type(message) is kind
    return kind.FromString(message.SerializeToString())


def stream(ctx, audio_chunks, config=None, **service_args) -> list[rasr.StreamingRecognizeResponse]:
    asr = service(ctx, **service_args)
    responses = asr.streaming_response_generator(audio_chunks, config or streaming_config())
    return [own_type(r, rasr.StreamingRecognizeResponse) for r in responses]


async def in_thread(worker, *args):
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(worker, *args)


def finals(responses) -> list:
    return [r for response in responses for r in response.results if r.is_final]


def transcript(results) -> str:
    """What Riva's own clients print: the finals concatenated (each ends with a space)."""
    return "".join(r.alternatives[0].transcript for r in results).strip()


async def native_text(ctx, samples: np.ndarray) -> str:
    results = await transcribe_raw(url(ctx, "ws"), samples)
    return " ".join(results[-1]["text"].split())


def wav_bytes(samples: np.ndarray, rate: int = 16000, extra_chunk: bool = True) -> bytes:
    """A 16-bit mono WAV file, with a LIST chunk before 'data' as many writers put one."""
    pcm = encode_audio(samples, "pcm16")
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    extra = b"LIST" + struct.pack("<I", 5) + b"INFOx\x00" if extra_chunk else b""
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", len(pcm)) + pcm
    return b"RIFF" + struct.pack("<I", len(body)) + body


def rpc_error(worker) -> grpc.RpcError:
    try:
        worker()
    except grpc.RpcError as exc:
        return exc
    raise AssertionError("the call succeeded")


# -- same text as the native protocol -----------------------------------------------------------


async def test_streaming_matches_native(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    async with running_server(engine) as ctx:
        expected = await native_text(ctx, sentence)
        responses = await in_thread(stream, ctx, chunks(pcm))
    results = [r for response in responses for r in response.results]
    assert expected and transcript(finals(responses)) == expected
    interim = [r for r in results if not r.is_final]
    assert interim and all(r.stability == 1.0 and not r.alternatives[0].words for r in interim)
    assert [r.alternatives[0].transcript for r in interim] == sorted(r.alternatives[0].transcript for r in interim)
    assert all(len(r.alternatives) == 1 and r.channel_tag == 1 for r in results)
    processed = [r.audio_processed for r in results]
    assert processed == sorted(processed) and processed[-1] <= len(sentence) / 16000 + 1e-3
    for final in finals(responses):
        alternative = final.alternatives[0]
        assert alternative.transcript.endswith(" ")
        assert " ".join(w.word for w in alternative.words) == alternative.transcript.strip()
        times = [t for w in alternative.words for t in (w.start_time, w.end_time)]
        assert times == sorted(times) and times[-1] <= len(sentence) / 16 + 1  # milliseconds
        # the model's confidence (server/streams/words.py): per word in (0, 1], the alternative's their mean
        confidences = [w.confidence for w in alternative.words]
        assert all(0 < c <= 1 for c in confidences) and min(confidences) < 1
        assert alternative.confidence == pytest.approx(sum(confidences) / len(confidences), abs=1e-3)
    printed = io.StringIO()  # the client's own printer reads every response
    riva_client.print_streaming(iter(responses), output_file=[printed], additional_info="time", word_time_offsets=True)
    assert expected.split()[-1] in printed.getvalue()


async def test_offline_matches_native(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")

    def offline(ctx):
        asr = service(ctx)
        raw = asr.offline_recognize(pcm, recognition_config(enable_word_time_offsets=True))
        # NVIDIA's transcribe_file_offline.py: the file's bytes, header included, encoding unset
        wav = asr.offline_recognize(wav_bytes(sentence), riva_client.RecognitionConfig(language_code="en-US"))
        return own_type(raw, rasr.RecognizeResponse), own_type(wav, rasr.RecognizeResponse)

    async with running_server(engine) as ctx:
        expected = await native_text(ctx, sentence)
        raw, wav = await in_thread(offline, ctx)
    assert transcript(raw.results) == transcript(wav.results) == expected
    assert all(r.channel_tag == 1 and 0 < r.alternatives[0].confidence < 1 for r in raw.results)
    assert raw.results[-1].audio_processed == pytest.approx(len(sentence) / 16000, abs=0.01)
    assert [w.word for r in raw.results for w in r.alternatives[0].words] == expected.split()
    assert not any(r.alternatives[0].words for r in wav.results)  # not asked for
    riva_client.print_offline(raw)


async def test_transcribe_file_as_nvidia_scripts_do(engine, sentence, tmp_path):
    """transcribe_file.py: the WAV file in 1600-frame chunks, header in the first one, with
    neither encoding nor rate in the config; and --list-models through GetRivaSpeechRecognitionConfig."""
    path = tmp_path / "sentence.wav"
    path.write_bytes(wav_bytes(sentence))

    def script(ctx):
        asr = service(ctx)
        config = riva_client.StreamingRecognitionConfig(
            config=riva_client.RecognitionConfig(language_code="en-US", max_alternatives=1), interim_results=True
        )
        with riva_client.AudioChunkFileIterator(str(path), 1600) as audio_chunks:
            responses = [own_type(r, rasr.StreamingRecognizeResponse)
                         for r in asr.streaming_response_generator(audio_chunks, config)]
        models = asr.stub.GetRivaSpeechRecognitionConfig(rasr.RivaSpeechRecognitionConfigRequest())
        none = asr.stub.GetRivaSpeechRecognitionConfig(rasr.RivaSpeechRecognitionConfigRequest(model_name="other"))
        return responses, own_type(models, rasr.RivaSpeechRecognitionConfigResponse), none

    async with running_server(engine) as ctx:
        expected = await native_text(ctx, sentence)
        responses, models, none = await in_thread(script, ctx)
    assert transcript(finals(responses)) == expected
    configs = {c.parameters["type"]: c for c in models.model_config}
    assert set(configs) == {"online", "offline"} and not none.model_config
    online = configs["online"]
    assert online.model_name == "demo" and online.parameters["language_code"] == "en-US"
    assert online.parameters["sample_rate"] == "16000" and online.parameters["lookahead_modes"] == "70,1"


async def test_two_utterances_in_one_call(engine, pause):
    """The model's end of utterance ends a final result; the call goes on with the next."""
    pcm = encode_audio(pause, "pcm16")
    async with running_server(engine) as ctx:
        native = await transcribe_raw(url(ctx, "ws"), pause)
        responses = await in_thread(stream, ctx, chunks(pcm))
    ends = sum(r["utterance_end"] for r in native if "utterance_end" in r)
    results = finals(responses)
    assert len(results) >= 2 and len(results) in (ends, ends + 1)
    assert transcript(results) == " ".join(native[-1]["text"].split())
    first_end = results[0].alternatives[0].words[-1].end_time
    second_start = results[1].alternatives[0].words[0].start_time
    assert second_start - first_end >= 1000  # the 1.5 s pause lies between them


async def test_resampled_and_telephony_audio(engine, sentence):
    """48 kHz PCM16 gives the 16 kHz text; 8 kHz mu-law / A-law the text of the same samples as PCM16."""
    high = soxr.resample(sentence, 16000, 48000).astype(np.float32)
    phone = soxr.resample(sentence, 16000, 8000).astype(np.float32)
    coded = {name: encode_g711(phone, table) for name, table in (("MULAW", MULAW), ("ALAW", ALAW))}

    def run(ctx):
        out = {"48k": stream(ctx, chunks(encode_audio(high, "pcm16"), 48000), streaming_config(rate=48000))}
        for name, (data, decoded) in coded.items():
            encoding = riva_client.AudioEncoding.Value(name)
            out[name] = stream(ctx, chunks(data, 8000, 1), streaming_config(rate=8000, encoding=encoding))
            linear = chunks(encode_audio(decoded, "pcm16"), 8000)
            out[name + " as pcm16"] = stream(ctx, linear, streaming_config(rate=8000))
        return {name: transcript(finals(responses)) for name, responses in out.items()}

    async with running_server(engine) as ctx:
        expected = await native_text(ctx, sentence)
        texts = await in_thread(run, ctx)
    assert texts["48k"] == expected
    for name in coded:
        assert texts[name] and texts[name] == texts[name + " as pcm16"]


def encode_g711(samples: np.ndarray, table: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The nearest code per sample, and the samples those codes decode to."""
    codes = np.abs(samples[:, None] - table[None, :]).argmin(axis=1).astype(np.uint8)
    return codes.tobytes(), table[codes]


# -- what a config may ask --------------------------------------------------------------------


async def test_framework_config_fields_are_accepted(engine, sentence):
    """Everything Pipecat's NvidiaSTTService and LiveKit's plugin put in a config, and more,
    is accepted and changes nothing: same text, one alternative."""
    pcm = encode_audio(sentence, "pcm16")
    config = streaming_config(
        language_code="en", model="parakeet-1.1b-en-US-asr-streaming-silero-vad-sortformer", max_alternatives=3,
        profanity_filter=True, enable_automatic_punctuation=True, verbatim_transcripts=True, audio_channel_count=1,
        enable_separate_recognition_per_channel=True,
    )
    riva_client.add_word_boosting_to_config(config, ["parakeet", "riva"], 4.0)
    riva_client.add_endpoint_parameters_to_config(config, -1, -1.0, 320, -1, -1.0, -1.0)
    riva_client.add_custom_configuration_to_config(config, "enable_vad_endpointing:true,neural_vad.onset:0.65")

    def run(ctx):
        return stream(ctx, chunks(pcm), config, function_id="bb0837de-8c7b-481f-9ec8-ef5663e9c1fa")

    async with running_server(engine) as ctx:
        expected = await native_text(ctx, sentence)
        responses = await in_thread(run, ctx)
    assert transcript(finals(responses)) == expected
    assert all(len(r.alternatives) == 1 for response in responses for r in response.results)


REFUSED = {
    "flac": ({"encoding": riva_client.AudioEncoding.FLAC}, "encoding FLAC"),
    "opus": ({"encoding": riva_client.AudioEncoding.OGGOPUS}, "encoding OGGOPUS"),
    "german": ({"language_code": "de-DE"}, "English"),
    "stereo": ({"audio_channel_count": 2}, "mono"),
    "diarization": (  # this server has no diarizer (tests/test_diarization.py has one)
        {"diarization_config": rasr.SpeakerDiarizationConfig(enable_speaker_diarization=True)}, "--diarizer"
    ),
    "rate": ({"sample_rate_hertz": 1000}, "sample_rate_hertz"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
async def test_unsupported_config_is_refused(engine, case):
    fields, said = REFUSED[case]
    fields = {"sample_rate_hertz": 16000, "language_code": "en-US", "encoding": LINEAR_PCM, **fields}

    def run(ctx):
        asr = service(ctx)
        config = riva_client.RecognitionConfig(**fields)
        asked = riva_client.StreamingRecognitionConfig(config=config)
        streaming = rpc_error(lambda: stream(ctx, iter([b"\0\0"]), asked))
        offline = rpc_error(lambda: asr.offline_recognize(b"\0\0", config))
        return streaming, offline

    async with running_server(engine) as ctx:
        errors = await in_thread(run, ctx)
    for error in errors:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and said in error.details(), error.details()


async def test_headerless_audio_needs_a_rate(engine):
    def run(ctx):
        config = riva_client.StreamingRecognitionConfig(config=riva_client.RecognitionConfig(language_code="en-US"))
        return rpc_error(lambda: stream(ctx, iter([b"\0\0" * 800]), config))

    async with running_server(engine) as ctx:
        error = await in_thread(run, ctx)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "sample_rate_hertz is required" in error.details()


# -- the same gates as every door ---------------------------------------------------------------


async def test_api_key(engine, sentence):
    pcm = encode_audio(sentence[:16000], "pcm16")

    def run(ctx):
        out = {}
        for name, key in (("none", None), ("wrong", "nope")):
            out[name] = rpc_error(lambda: stream(ctx, chunks(pcm), key=key))
            stub = service(ctx, key=key).stub
            out[name + " config"] = rpc_error(
                lambda: stub.GetRivaSpeechRecognitionConfig(rasr.RivaSpeechRecognitionConfigRequest())
            )
        out["good"] = stream(ctx, chunks(pcm), key="secret", function_id="any")
        return out

    async with running_server(engine, api_key="secret") as ctx:
        out = await in_thread(run, ctx)
    for name in ("none", "wrong", "none config", "wrong config"):
        assert out[name].code() == grpc.StatusCode.UNAUTHENTICATED and "API key" in out[name].details()
    assert finals(out["good"])


async def test_full_queue_is_resource_exhausted_and_queued_calls_are_served(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    queue = engine.stats()["max_queue"]
    done: list = []
    release = trio.Event()

    async def queued(ctx):
        done.append(await in_thread(stream, ctx, chunks(pcm)))

    async with running_server(engine) as ctx:
        expected = await native_text(ctx, sentence)
        async with trio.open_nursery() as nursery:
            await nursery.start(hold_every_slot, ctx, release)
            for _ in range(queue):
                nursery.start_soon(queued, ctx)
            await wait_until(lambda: engine.stats()["queued"] == queue)
            error = await in_thread(lambda: rpc_error(lambda: stream(ctx, chunks(pcm))))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue is full" in error.details()
            release.set()
    assert len(done) == queue and all(transcript(finals(r)) == expected for r in done)


async def test_drain_finishes_active_streams_and_refuses_new_calls(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    box: dict = {}
    started = threading.Event()

    def paced(ctx):
        def audio():
            for i, piece in enumerate(chunks(pcm, pace=CHUNK_SECONDS / 2)):
                if i == 3:
                    started.set()
                yield piece

        box["responses"] = stream(ctx, audio())

    async with trio.open_nursery() as outer:
        async with running_server(engine) as ctx:
            expected = await native_text(ctx, sentence)
            outer.start_soon(in_thread, paced, ctx)
            await in_thread(started.wait)
            ctx.shutdown.set()
            await trio.sleep(0.05)  # the door hears of it
            refused = await in_thread(lambda: rpc_error(lambda: stream(ctx, chunks(pcm))))
            assert "responses" not in box  # still streaming while new calls are refused
    assert refused.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in refused.details()
    assert transcript(finals(box["responses"])) == expected  # the drain let it finish


async def test_drain_timeout_finalizes_and_ends_unavailable(engine, sentence):
    """A stream that never ends is finalized at the drain timeout: its final result, then UNAVAILABLE."""
    pcm = encode_audio(sentence, "pcm16")
    seen: list = []
    outcome: list = []
    stop = threading.Event()

    def endless(ctx):
        def audio():
            yield from chunks(pcm)
            stop.wait(30)  # never half-closes

        try:
            for response in service(ctx).streaming_response_generator(audio(), streaming_config(interim=False)):
                seen.append(response)
        except grpc.RpcError as exc:
            outcome.append(exc)
        finally:
            stop.set()

    async with trio.open_nursery() as outer:
        async with running_server(engine, drain_timeout=1) as ctx:
            outer.start_soon(in_thread, endless, ctx)
            await wait_until(lambda: engine.stats()["active"] == 1)
            await trio.sleep(0.5)
            ctx.shutdown.set()
    assert outcome[0].code() == grpc.StatusCode.UNAVAILABLE and "reconnect" in outcome[0].details()
    assert finals(seen)


async def test_queued_calls_are_told_to_reconnect_at_once_on_shutdown(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    outcome: list = []
    release = trio.Event()

    async def queued(ctx) -> None:
        outcome.append(await in_thread(lambda: rpc_error(lambda: stream(ctx, chunks(pcm)))))
        outcome.append(trio.current_time())

    async with trio.open_nursery() as outer:
        async with running_server(engine, drain_timeout=3) as ctx:
            await outer.start(hold_every_slot, ctx, release)
            outer.start_soon(queued, ctx)
            await wait_until(lambda: engine.stats()["queued"] == 1)
            ctx.shutdown.set()
            shutdown_at = trio.current_time()
            await wait_until(lambda: len(outcome) == 2)
            release.set()
    error, ended_at = outcome
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "reconnect" in error.details()
    assert ended_at - shutdown_at < 1  # not after the drain timeout


# -- hostile input ------------------------------------------------------------------------------


def raw_stream(ctx, messages: list[bytes]) -> grpc.RpcError:
    """Bytes sent as StreamingRecognize requests on a bare channel (no protobuf on our side)."""
    with grpc.insecure_channel(f"127.0.0.1:{ctx.config.ports['grpc']}") as channel:
        call = channel.stream_stream(SERVICE + "StreamingRecognize")
        return rpc_error(lambda: list(call(iter(messages))))


def request(**fields) -> bytes:
    return rasr.StreamingRecognizeRequest(**fields).SerializeToString()


async def test_hostile_input_gets_status_codes_and_no_traceback(engine, sentence, caplog):
    caplog.set_level(logging.INFO)
    pcm = encode_audio(sentence, "pcm16")
    config = request(streaming_config=streaming_config())
    audio = request(audio_content=pcm[:3200])

    def attack(ctx) -> dict:
        port = ctx.config.ports["grpc"]
        out = {
            "malformed": raw_stream(ctx, [b"\xff\xff\xff\xff garbage"]),
            "malformed later": raw_stream(ctx, [config, audio, b"\x12\xff"]),
            "audio first": raw_stream(ctx, [audio, config]),
            "empty first": raw_stream(ctx, [b""]),
            "config twice": raw_stream(ctx, [config, audio, config]),
            "20 MB": raw_stream(ctx, [config, request(audio_content=b"\0" * (20 << 20))]),
        }
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            for name in ("Recognize", "GetRivaSpeechRecognitionConfig"):
                out[name] = rpc_error(lambda: channel.unary_unary(SERVICE + name)(b"\x0a\xff\xff"))
        return out

    async with running_server(engine) as ctx:
        expected = result_tokens(await transcribe_raw(url(ctx, "ws"), sentence))
        async with trio.open_nursery() as nursery:  # a good stream on another door meanwhile
            good: list = []
            nursery.start_soon(lambda: _append(good, transcribe_raw(url(ctx, "ws"), sentence, paced=0.02)))
            out = await in_thread(attack, ctx)
        await wait_until(lambda: engine.stats()["active"] == 0)
    assert expected and result_tokens(good[0]) == expected
    invalid = ("malformed", "malformed later", "audio first", "empty first", "config twice", "Recognize",
               "GetRivaSpeechRecognitionConfig")
    for name in invalid:
        assert out[name].code() == grpc.StatusCode.INVALID_ARGUMENT, (name, out[name])
        assert out[name].details(), name
    assert "protobuf" in out["malformed"].details() and "first message" in out["audio first"].details()
    assert out["20 MB"].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Traceback" not in caplog.text and "ERROR" not in caplog.text, caplog.text[-3000:]


async def _append(box: list, coroutine) -> None:
    box.append(await coroutine)


async def test_a_thousand_tiny_messages_give_the_same_text(engine, sentence):
    """Messages cut anywhere, even inside a sample: the audio is a byte stream."""
    pcm = encode_audio(sentence, "pcm16")
    cuts = np.linspace(0, len(pcm), 1001).astype(int)
    tiny = [pcm[a:b] for a, b in zip(cuts, cuts[1:])]
    assert any(len(piece) % 2 for piece in tiny)
    async with running_server(engine) as ctx:
        expected = await native_text(ctx, sentence)
        responses = await in_thread(stream, ctx, iter(tiny))
    assert transcript(finals(responses)) == expected


async def test_cancelled_calls_free_their_slot_at_once(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")

    def start(ctx):
        stub = rasr_grpc.RivaSpeechRecognitionStub(grpc.insecure_channel(f"127.0.0.1:{ctx.config.ports['grpc']}"))
        never = threading.Event()

        def requests():
            yield rasr.StreamingRecognizeRequest(streaming_config=streaming_config())
            yield rasr.StreamingRecognizeRequest(audio_content=pcm[:16000])
            never.wait(30)

        return stub.StreamingRecognize(requests()), never

    async with running_server(engine) as ctx:
        for _ in range(3):
            call, never = await in_thread(start, ctx)
            await wait_until(lambda: engine.stats()["active"] == 1)
            call.cancel()
            await wait_until(lambda: engine.stats()["active"] == 0, timeout=1.0)
            never.set()
        status, metrics = await http_get(ctx.config.ports["http"], "/metrics")
    assert status == 200
    assert b'parakeet_streams_total{protocol="riva"} 3.0' in metrics
    assert b'parakeet_connections{protocol="riva"} 0.0' in metrics


def raw_requests(ctx, requests, hold: threading.Event | None = None):
    """StreamingRecognize with these requests through the generated stub; with `hold`, the
    client then waits (neither sending nor half-closing) until it is set."""
    def generate():
        yield from requests
        if hold is not None:
            hold.wait(30)

    stub = rasr_grpc.RivaSpeechRecognitionStub(grpc.insecure_channel(f"127.0.0.1:{ctx.config.ports['grpc']}"))
    responses: list = []
    try:
        for response in stub.StreamingRecognize(generate()):
            responses.append(response)
    except grpc.RpcError as exc:
        return responses, exc
    finally:
        if hold is not None:
            hold.set()
    return responses, None


async def test_request_id_is_echoed(engine, sentence):
    from riva.client.proto.riva_common_pb2 import RequestId

    pcm = encode_audio(sentence, "pcm16")

    def run(ctx):
        streaming = raw_requests(ctx, [
            rasr.StreamingRecognizeRequest(streaming_config=streaming_config(), id=RequestId(value="call-7")),
            rasr.StreamingRecognizeRequest(audio_content=pcm),
        ])
        offline = service(ctx).stub.Recognize(
            rasr.RecognizeRequest(config=recognition_config(), audio=pcm, id=RequestId(value="file-9"))
        )
        return streaming, offline

    async with running_server(engine) as ctx:
        (responses, error), offline = await in_thread(run, ctx)
    assert error is None and responses and all(r.id.value == "call-7" for r in responses)
    assert offline.results and offline.id.value == "file-9"


async def test_idle_streams_and_the_stream_time_limit(engine, sentence):
    pcm = encode_audio(sentence, "pcm16")
    config = rasr.StreamingRecognizeRequest(streaming_config=streaming_config(interim=False))

    def run(ctx):
        idle = raw_requests(ctx, [config, rasr.StreamingRecognizeRequest(audio_content=pcm[:3200])], threading.Event())
        long = raw_requests(ctx, [config, rasr.StreamingRecognizeRequest(audio_content=pcm)], threading.Event())
        return idle, long

    async with running_server(engine, idle_timeout=0.5, max_stream_seconds=1.0) as ctx:
        (_, idle), (responses, cut) = await in_thread(run, ctx)
    assert idle.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "no audio for 0.5 s" in idle.details()
    assert cut.code() == grpc.StatusCode.OUT_OF_RANGE and "at most 1 s of audio" in cut.details()
    assert finals(responses) and finals(responses)[-1].audio_processed <= 1.0 + 1e-6


async def test_config_must_arrive_within_the_handshake_timeout(engine):
    def silent(ctx):
        never = threading.Event()

        def requests():
            never.wait(10)
            yield rasr.StreamingRecognizeRequest()

        try:
            return rpc_error(lambda: list(
                rasr_grpc.RivaSpeechRecognitionStub(
                    grpc.insecure_channel(f"127.0.0.1:{ctx.config.ports['grpc']}")
                ).StreamingRecognize(requests())
            ))
        finally:
            never.set()

    async with running_server(engine, handshake_timeout=0.3) as ctx:
        start = trio.current_time()
        error = await in_thread(silent, ctx)
        assert trio.current_time() - start < 3
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "streaming_config" in error.details()


# -- pieces -------------------------------------------------------------------------------------


def test_grpc_port_is_documented_beside_the_other_ports():
    parser = build_parser()
    assert "--grpc-port" in parser.format_help() and "Riva" in parser.format_help()
    assert parser.parse_args([]).grpc_port == 50051
    assert parser.parse_args(["--grpc-port", "off"]).grpc_port is None
    assert parser.parse_args(["--grpc-port", "0"]).grpc_port == 0


def test_wav_headers():
    samples = np.linspace(-0.5, 0.5, 100, dtype=np.float32)
    header = parse_wav(wav_bytes(samples, 8000))
    assert (header.encoding, header.sample_rate, header.channels, header.size) == ("pcm16", 8000, 1, 200)
    stereo = wav_bytes(samples).replace(struct.pack("<HH", 1, 1), struct.pack("<HH", 1, 2), 1)
    with pytest.raises(RivaError, match="2 channels"):
        AudioInput(Options("pcm16", 16000)).decode(stereo)
    eight_bit = wav_bytes(samples).replace(struct.pack("<HH", 2, 16), struct.pack("<HH", 2, 8), 1)
    with pytest.raises(RivaError, match="8-bit"):
        parse_wav(eight_bit)
    assert parse_wav(wav_bytes(samples)[:30]) is None  # more to come
    truncated = AudioInput(Options(None, None))
    assert len(truncated.decode(wav_bytes(samples)[:30])) == 0
    with pytest.raises(RivaError, match="header ends"):
        truncated.finish()
    endless = b"RIFF\0\0\0\0WAVE" + b"LIST" + struct.pack("<I", 1 << 20) + bytes(1 << 17)
    with pytest.raises(RivaError, match="no 'data' chunk"):
        parse_wav(endless)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4000), max_size=12), st.booleans())
def test_audio_cut_anywhere_decodes_the_same(cuts, wav):
    """AudioInput over any split of the bytes equals AudioInput over all of them."""
    samples = np.sin(np.arange(4000) / 7).astype(np.float32) * 0.5
    data = wav_bytes(samples, 8000) if wav else encode_audio(samples, "pcm16")
    whole = AudioInput(Options(None, 8000))
    expected = np.concatenate([whole.decode(data), whole.finish()])
    split = AudioInput(Options(None, 8000))
    bounds = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    got = np.concatenate([split.decode(data[a:b]) for a, b in zip(bounds, bounds[1:])] + [split.finish()])
    assert np.array_equal(got, expected)


async def test_a_client_that_stops_reading_is_dropped():
    """Every response has --send-timeout to be taken by gRPC's flow control."""
    import asyncio

    from parakeet_stream.server.protocols.riva.streaming import StreamingCall
    from parakeet_stream.server.protocols.riva.transcript import Piece

    class Stuck:
        async def write(self, message):
            await asyncio.sleep(3600)

    class Ctx:
        config = ServerConfig(send_timeout=0.05)

    async def attempt():
        call = StreamingCall(Ctx(), Stuck())
        await call._send(Piece(rasr.SpeechRecognitionAlternative(transcript="x"), False, 0.1))

    with pytest.raises(RivaError) as info:
        await trio.to_thread.run_sync(asyncio.run, attempt())
    assert info.value.code == "slow_consumer" and info.value.status == grpc.StatusCode.DEADLINE_EXCEEDED


# -- flooding calls, in a real server process ---------------------------------------------------


def grpc_flooder(port: int, piece: bytes, stop: threading.Event) -> None:
    """A StreamingRecognize call sending `piece` as fast as gRPC takes it, until `stop`."""
    def requests():
        yield rasr.StreamingRecognizeRequest(streaming_config=streaming_config(interim=False))
        while not stop.is_set():
            yield rasr.StreamingRecognizeRequest(audio_content=piece)

    stub = rasr_grpc.RivaSpeechRecognitionStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    try:
        for _ in stub.StreamingRecognize(requests()):
            pass
    except grpc.RpcError:
        pass


def warm_up_grpc(port: int, pcm: bytes) -> None:
    asr = riva_client.ASRService(riva_client.Auth(uri=f"127.0.0.1:{port}", use_ssl=False))
    assert finals(asr.streaming_response_generator(chunks(pcm), streaming_config()))
    assert asr.offline_recognize(pcm, recognition_config()).results


async def test_flooding_calls_hold_their_budget_and_other_doors_are_unaffected(serve, sentence):
    """One admitted call flooding 2-byte messages and three queued ones flooding 2-byte or
    nearly 1 MiB messages (the rate limit lifted, so only the budgets bound them): the server
    holds no more than the documented bound of four connections (docs/protocol.md section 5),
    and a native stream's tokens are those of its solo run. The server's log stays clean
    (checked by `serve`)."""
    server = serve("--max-num-streams", "2", "--max-queue", "4", "--max-messages-per-second", "1e9")
    port, stop, rss = server.ports["grpc"], threading.Event(), []
    await warm_up(server, sentence)
    await in_thread(warm_up_grpc, port, encode_audio(sentence, "pcm16"))  # gRPC's first-use allocations
    solo, _ = await good_stream(server.url("tcp"), sentence)

    async def counts(active: int, queued: int) -> bool:
        health = await server.health()
        return (health["active"], health["queued"]) == (active, queued)

    async def flood() -> None:
        """Once the good stream holds its slot: the flooders take the other slot and the queue."""
        rss.append(server.rss_mb())
        nursery.start_soon(trio.to_thread.run_sync, grpc_flooder, port, b"\x01\x00", stop)
        await wait_for(lambda: counts(2, 0), timeout=10)
        for piece in (b"\x01\x00", bytes((1 << 20) - 64), bytes((1 << 20) - 64)):
            nursery.start_soon(trio.to_thread.run_sync, grpc_flooder, port, piece, stop)
        await wait_for(lambda: counts(2, 3), timeout=10)
        nursery.start_soon(sample_rss)

    async def sample_rss() -> None:
        while True:
            rss.append(server.rss_mb())
            await trio.sleep(0.2)

    async with trio.open_nursery() as nursery:
        tokens, _ = await good_stream(server.url("tcp"), sentence, flood)
        await trio.sleep(1)  # a queued flooder takes the freed slot and fills its budget
        stop.set()
        nursery.cancel_scope.cancel()
    print(f"RSS {rss[0]:.0f} MB -> peak {max(rss):.0f} MB with four flooding gRPC calls")
    assert tokens == solo
    assert max(rss) - rss[0] <= 4 * connection_bytes(ServerConfig()) / 2**20 + 10

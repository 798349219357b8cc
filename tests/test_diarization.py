"""Speakers per word: the engine's diarize stage (engine/diarizer.py) and each API's diarization.

The diarizer is the tiny random-init Streaming Sortformer fixture (its speaker decisions are
arbitrary), the recogniser the demo model, the audio espeak-ng speech in two voices: every check
compares the server with an offline run of the same diarizer over the same audio, done here.
"""
from __future__ import annotations

import math
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import Raw, audio_messages, behind_service, collect_until_final, diarized_speakers, metric, pcm16_exact, refused_handshake, running_server, tokens_of, url

from demo_model.conversations import FRAME, HOP, activity
from demo_model.speech import synth
from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine, EngineError
from parakeet_stream.engine.diarizer import TOKEN_LAG_FRAMES
from parakeet_stream.engine.diarizer_model import DEFAULT_LATENCY, live_streaming
from parakeet_stream.model.sortformer import Sortformer
from parakeet_stream.model.sortformer_streaming import StreamingSortformer, stream_features
from parakeet_stream.server.streams.speakers import SpeakerTimeline
from parakeet_stream.server.streams.words import WordTracker

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")

SORTFORMER = Path(__file__).parent / "fixtures" / "nemo" / "sortformer_tiny.nemo"
PACKET = 2560
RATE = 16000
VOICES = [("en-us", "the red fox jumps over the lazy dog"), ("en-us+f3", "she sells sea shells by the sea shore"),
          ("en-gb", "seven green apples fell from the tall tree")]


@pytest.fixture(scope="module")
def sortformer() -> Sortformer:
    return Sortformer.from_nemo(SORTFORMER)


@pytest.fixture(scope="module")
def voices() -> list[np.ndarray]:
    return [pcm16_exact(synth({"voice": voice, "variant": "default", "speed": 160, "pitch": 50, "text": text}, seed=i))
            for i, (voice, text) in enumerate(VOICES)]


@pytest.fixture(scope="module")
def dialogue(voices) -> np.ndarray:
    """Two voices, one after the other."""
    return np.concatenate(voices[:2])


@pytest.fixture(scope="module")
def engine(sortformer):
    with ASREngine("demo", max_num_streams=4, max_queue=4, diarizer=sortformer) as e:
        yield e


@pytest.fixture(scope="module")
def plain_engine():
    with ASREngine("demo", max_num_streams=4, max_queue=4) as e:
        yield e


def offline(sortformer: Sortformer, samples: np.ndarray, latency: float = DEFAULT_LATENCY) -> np.ndarray:
    """The diarizer over the whole audio at once, as NeMo streams a file: probabilities [frames, speakers]."""
    with torch.no_grad():
        feats = sortformer.features(torch.from_numpy(samples))[0]
    return stream_features(StreamingSortformer(sortformer, live_streaming(sortformer, latency)), [feats])[0].numpy()


def word_speaker(probs: np.ndarray, start: float, end: float, most: int) -> int:
    """The speaker most active over the 80 ms frames of the word's audio (at least one): its times
    moved two recogniser frames (2 x 80 ms) earlier, where the voice sounded before its tokens came."""
    start, end = start - 0.16, end - 0.16
    first = min(max(0, int(start / 0.08 + 1e-6)), len(probs) - 1)
    stop = max(first + 1, min(math.ceil(end / 0.08 - 1e-6), len(probs)))
    return int(probs[first:stop, :most].sum(0).argmax())


def run(engine, samples: np.ndarray, diarize: bool) -> list:
    sid = engine.create_stream(diarize=diarize)
    for i in range(0, len(samples), PACKET):
        engine.push_audio(sid, samples[i : i + PACKET])
    engine.finalize(sid)
    return collect_until_final(engine, sid)


def speakers_of(results) -> np.ndarray:
    return np.concatenate([r.speakers for r in results if r.speakers is not None])


# -- the engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast_engine(sortformer):
    with ASREngine("demo", max_num_streams=4, max_queue=4, diarizer=sortformer, diarizer_latency=0.32) as e:
        yield e


@pytest.mark.parametrize("latency", [1.04, 0.32])
def test_speaker_probabilities_equal_the_offline_run_and_cover_each_result(latency, request, sortformer, dialogue):
    engine = request.getfixturevalue("engine" if latency == DEFAULT_LATENCY else "fast_engine")
    results = run(engine, dialogue, diarize=True)
    got, want = speakers_of(results), offline(sortformer, dialogue, latency)
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-4
    covered, early = 0, 0
    frame, lag = engine.info.speaker_frame_seconds, TOKEN_LAG_FRAMES * engine.info.frame_seconds
    for r in results:  # each result waits until the diarizer heard its words' audio (the recogniser's padding past its end too)
        covered += 0 if r.speakers is None else len(r.speakers)
        assert min(r.audio_seconds - lag, len(got) * frame) <= covered * frame + 1e-6
        # out before the diarizer reached the tokens' times (not the stream's end, where everything goes)
        early += covered * frame + 1e-6 < r.audio_seconds < len(got) * frame
    assert early  # no later than the words' audio needs
    assert engine.info.speakers == sortformer.cfg.n_spk


def test_streams_batched_give_what_each_gives_alone(engine, voices, dialogue):
    audios = [dialogue, voices[2], np.concatenate([voices[2], voices[0]])]
    alone = [speakers_of(run(engine, a, diarize=True)) for a in audios]
    together = diarized_speakers(engine, audios, PACKET)
    for a, b in zip(alone, together):
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-4


def test_a_stream_without_diarization_gets_the_same_tokens_and_runs_no_diarizer(engine, plain_engine, dialogue,
                                                                               monkeypatch):
    steps = []
    step = engine.diarizer.sortformer.step
    monkeypatch.setattr(engine.diarizer.sortformer, "step", lambda *a, **k: steps.append(1) or step(*a, **k))
    results = run(engine, dialogue, diarize=False)
    assert not steps and all(r.speakers is None for r in results)
    assert tokens_of(results) == tokens_of(run(plain_engine, dialogue, diarize=False)) and tokens_of(results)
    run(engine, dialogue, diarize=True)
    assert steps  # the spy sees the diarizer where it runs


def test_an_engine_without_a_diarizer_refuses_a_diarized_stream(plain_engine):
    with pytest.raises(EngineError) as info:
        plain_engine.create_stream(diarize=True)
    assert info.value.code == "diarization_unavailable" and "--diarizer" in info.value.message


TURN_TAKING = [("en-us", "could you pass me the salt"), ("en-gb+f3", "of course here it is"),
               ("en-us", "thank you so much")]


def test_each_word_gets_the_speaker_of_its_audio_also_the_last_before_a_short_pause(engine):
    """The recogniser's words timed by their tokens, which come after the audio they transcribe: a
    turn's last word ("is") must not take the speaker of the pause and the next voice after it.
    The diarizer here is exact (each voice's measured speech per 80 ms frame), so only the way a
    word is matched with speaker frames is tested."""
    pause, parts, spans = np.zeros(int(0.15 * RATE), np.float32), [], []
    for i, (voice, text) in enumerate(TURN_TAKING):
        name, variant = (voice.split("+") + ["default"])[:2]
        samples = pcm16_exact(synth({"voice": name, "variant": variant, "speed": 170, "pitch": 50, "text": text},
                                    seed=i, lead=0.0, tail=0.0))
        spans.append((sum(x.size for x in parts), activity(samples)))
        parts += [samples, pause]
    audio = np.concatenate(parts)
    frames = -(-audio.size // FRAME)
    heard = np.zeros((frames * FRAME // HOP, engine.info.speakers), np.float32)  # per 10 ms
    for turn, (at, active) in enumerate(spans):
        heard[at // HOP : at // HOP + active.size, turn % 2] = active
    exact = heard.reshape(frames, FRAME // HOP, -1).mean(1).round()  # a voice in at least half a frame
    results = run(engine, audio, diarize=True)
    tracker, timeline, words = WordTracker(engine.info), SpeakerTimeline(engine.info, engine.info.speakers), []
    timeline.add(SimpleNamespace(speakers=exact))
    for result in results:
        words += timeline.label(tracker.update(result, result.audio_seconds, close=result.is_final))
    said = [turn % 2 for turn, (_, text) in enumerate(TURN_TAKING) for _ in text.split()]
    assert len(words) == len(said), [w["word"] for w in words]  # the recogniser heard each word
    assert [(w["word"], w["speaker"]) for w in words] == [(w["word"], s) for w, s in zip(words, said)]


# -- the native protocol ----------------------------------------------------------------------


async def native_words(address: str, samples: np.ndarray, **start) -> list[dict]:
    async with Raw.open(address) as conn:
        await conn.send({"type": "start", **start})
        started = await conn.until("started")
        assert started[-1]["diarize"] is bool(start.get("diarize"))
        for message in audio_messages(samples):
            await conn.send(message)
        results = [m for m in await conn.until("result", is_final=True) if m["type"] == "result"]
    return [w for r in results for w in r["words"]]


@pytest.mark.parametrize("kind", ["tcp", "ws"])
async def test_native_words_carry_the_offline_speaker(engine, sortformer, dialogue, kind):
    probs = offline(sortformer, dialogue)
    async with running_server(engine) as ctx:
        words = await native_words(url(ctx, kind), dialogue, diarize=True)
        one = await native_words(url(ctx, kind), dialogue, diarize=True, max_speakers=1)
        plain = await native_words(url(ctx, kind), dialogue)
    assert words and [w["speaker"] for w in words] == [word_speaker(probs, w["start"], w["end"], 4) for w in words]
    assert {w["speaker"] for w in one} == {0}
    assert all("speaker" not in w for w in plain) and [w["word"] for w in plain] == [w["word"] for w in words]


async def test_words_through_a_worker_process_carry_the_speakers_they_carry_in_one(engine, dialogue):
    """A worker reaches the engine process through the engine client: a diarized stream's results,
    held there for the diarizer, come as News with their speaker probabilities."""
    async with running_server(engine) as ctx:
        alone = await native_words(url(ctx, "ws"), dialogue, diarize=True)
    with behind_service(engine) as client:
        assert (client.info.speakers, client.info.speaker_frame_seconds) == (engine.info.speakers,
                                                                              engine.info.speaker_frame_seconds)
        async with running_server(client) as ctx:
            remote = await native_words(url(ctx, "ws"), dialogue, diarize=True)
            plain = await native_words(url(ctx, "ws"), dialogue)
    assert remote and remote == alone and all("speaker" in w for w in remote)
    assert [w["word"] for w in plain] == [w["word"] for w in remote] and all("speaker" not in w for w in plain)


@pytest.mark.parametrize("start,field", [
    ({"diarize": "yes"}, "diarize"), ({"diarize": True, "max_speakers": 0}, "max_speakers"),
    ({"diarize": True, "max_speakers": 1000}, "max_speakers"), ({"diarize": True, "max_speakers": "2"}, "max_speakers"),
])
async def test_native_refuses_hostile_values(engine, start, field):
    async with running_server(engine) as ctx, Raw.open(url(ctx, "ws")) as conn:
        await conn.send({"type": "start", **start})
        error = (await conn.until("error"))[-1]
    assert error["code"] == "invalid_config" and field in error["message"]


async def test_native_on_a_server_without_a_diarizer_says_so(plain_engine, dialogue):
    async with running_server(plain_engine) as ctx:
        async with Raw.open(url(ctx, "ws")) as conn:
            await conn.send({"type": "start", "diarize": True})
            error = (await conn.until("error"))[-1]
        assert error["code"] == "diarization_unavailable" and "--diarizer" in error["message"]
        async with Raw.open(url(ctx, "ws")) as conn:  # the server goes on serving
            await conn.send({"type": "start", "diarize": False})
            await conn.until("started")


# -- Deepgram, live and pre-recorded, through the official SDK -----------------------------------


def deepgram_client(ctx):
    from deepgram import DeepgramClient
    from deepgram.environment import DeepgramClientEnvironment

    port, http = ctx.config.ports["ws"], ctx.config.ports["http"]
    env = DeepgramClientEnvironment(base=f"http://127.0.0.1:{http}", production=f"ws://127.0.0.1:{port}",
                                    agent="", agent_rest="")
    return DeepgramClient(api_key="unused", environment=env)


def deepgram_live(ctx, samples: np.ndarray, **params) -> list[dict]:
    data = (np.round(samples * 32768).clip(-32768, 32767).astype("<i2")).tobytes()
    with deepgram_client(ctx).listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=16000,
                                                **params) as socket:
        for i in range(0, len(data), 3200):
            socket.send_media(data[i : i + 3200])
        socket.send_close_stream()
        return [m.model_dump(exclude_none=True) for m in socket if m.type == "Results"]


async def test_deepgram_live_words_carry_the_offline_speaker_and_finals_keep_it(engine, sortformer, dialogue):
    pytest.importorskip("deepgram")
    import trio

    probs = offline(sortformer, dialogue)
    async with running_server(engine) as ctx:
        messages = await trio.to_thread.run_sync(
            lambda: deepgram_live(ctx, dialogue, diarize="true", interim_results="true"))
    finals = [w for m in messages if m["is_final"] for w in m["channel"]["alternatives"][0]["words"]]
    assert finals and [w["speaker"] for w in finals] == [word_speaker(probs, w["start"], w["end"], 4) for w in finals]
    final_speaker = {(w["word"], w["start"]): w["speaker"] for w in finals}
    interims = [w for m in messages if not m["is_final"] for w in m["channel"]["alternatives"][0]["words"]]
    assert interims and all("speaker" in w for w in interims)
    complete = [w for w in interims if (w["word"], w["start"]) in final_speaker]
    assert complete and all(final_speaker[(w["word"], w["start"])] == w["speaker"] for w in complete)


async def test_deepgram_prerecorded_words_carry_speaker_and_confidence(engine, sortformer, dialogue):
    pytest.importorskip("deepgram")
    import trio
    from helpers import audio_file

    probs = offline(sortformer, dialogue)
    async with running_server(engine) as ctx:
        response = await trio.to_thread.run_sync(lambda: deepgram_client(ctx).listen.v1.media.transcribe_file(
            request=audio_file(dialogue), diarize=True).model_dump(exclude_none=True))
    words = response["results"]["channels"][0]["alternatives"][0]["words"]
    assert words and [w["speaker"] for w in words] == [word_speaker(probs, w["start"], w["end"], 4) for w in words]
    assert all(0 <= w["speaker_confidence"] <= 1 for w in words)


@pytest.mark.parametrize("value", ["yes", "1", "TRUE"])
async def test_deepgram_refuses_a_diarize_that_is_not_true_or_false(engine, value):
    async with running_server(engine) as ctx:
        response = await refused_handshake(
            f"ws://127.0.0.1:{ctx.config.ports['ws']}/v1/listen?encoding=linear16&sample_rate=16000&diarize={value}")
    assert response.status_code == 400 and b"INVALID_QUERY_PARAMETER" in response.body and b"diarize" in response.body


async def test_deepgram_without_a_diarizer_refuses_diarize_and_serves_the_rest(plain_engine, dialogue):
    pytest.importorskip("deepgram")
    import trio
    from deepgram.core.api_error import ApiError
    from helpers import audio_file

    async with running_server(plain_engine) as ctx:
        with pytest.raises(ApiError) as error:
            await trio.to_thread.run_sync(lambda: deepgram_client(ctx).listen.v1.media.transcribe_file(
                request=audio_file(dialogue), diarize=True))
        messages = await trio.to_thread.run_sync(lambda: deepgram_live(ctx, dialogue))
    assert error.value.status_code == 400 and "--diarizer" in str(error.value.body)
    assert messages and all("speaker" not in w for m in messages for w in m["channel"]["alternatives"][0]["words"])



# -- Riva, streaming and offline, through the official client -------------------------------------


def riva_config(**diarization):
    """What riva.client's scripts send; `diarization`: add_speaker_diarization_to_config's arguments."""
    import riva.client

    config = riva.client.RecognitionConfig(encoding=riva.client.AudioEncoding.LINEAR_PCM, sample_rate_hertz=16000,
                                           language_code="en-US", enable_word_time_offsets=True)
    if diarization:
        riva.client.add_speaker_diarization_to_config(config, **diarization)
    return config


def riva_calls(ctx, samples: np.ndarray, config) -> list:
    """A streaming call's results (with interim results) and an offline call's, or the RpcError of each."""
    import riva.client

    asr = riva.client.ASRService(riva.client.Auth(uri=f"127.0.0.1:{ctx.config.ports['grpc']}", use_ssl=False))
    pcm = encode_audio(samples, "pcm16")
    pieces = (pcm[i : i + 3200] for i in range(0, len(pcm), 3200))
    streaming = riva.client.StreamingRecognitionConfig(config=config, interim_results=True)
    return [outcome(lambda: [r for out in asr.streaming_response_generator(pieces, streaming) for r in out.results]),
            outcome(lambda: list(asr.offline_recognize(pcm, config).results))]


def outcome(call):
    """What `call()` returns, or the grpc.RpcError it raises."""
    import grpc

    try:
        return call()
    except grpc.RpcError as exc:
        return exc


def final_words(results) -> list:
    return [w for r in results if getattr(r, "is_final", True) for w in r.alternatives[0].words]


def final_text(results) -> str:
    return "".join(r.alternatives[0].transcript for r in results if getattr(r, "is_final", True)).strip()


def diarized(most: int) -> dict:
    return {"diarization_enable": True, "diarization_max_speakers": most}


async def test_riva_final_words_carry_the_offline_speaker_tag(engine, sortformer, dialogue):
    import trio

    probs = offline(sortformer, dialogue)
    asked = {"all": diarized(0), "clamped": diarized(1000), "two": diarized(2), "one": diarized(1), "off": {}}
    async with running_server(engine) as ctx:
        calls = {name: await trio.to_thread.run_sync(riva_calls, ctx, dialogue, riva_config(**fields))
                 for name, fields in asked.items()}
    spoken = [w.word for w in final_words(calls["off"][0])]
    for name, most in (("all", 4), ("clamped", 4), ("two", 2), ("one", 1)):
        for results in calls[name]:  # streaming, offline
            words = final_words(results)
            assert [w.word for w in words] == spoken, name
            # numbered from 1, as riva_asr.proto says (0: no speaker)
            want = [word_speaker(probs, w.start_time / 1000, w.end_time / 1000, most) + 1 for w in words]
            assert [w.speaker_tag for w in words] == want, name
            assert all(1 <= tag <= most for tag in want)
    assert len({w.speaker_tag for w in final_words(calls["all"][0])}) > 1  # the fixture tells the voices apart
    assert spoken and all(w.speaker_tag == 0 for results in calls["off"] for w in final_words(results))
    interims = [r for r in calls["all"][0] if not r.is_final]
    assert interims and not any(r.alternatives[0].words for r in interims)  # as Riva's: words on finals only


async def test_riva_diarization_gives_words_without_word_time_offsets(engine, dialogue):
    import trio

    config = riva_config(**diarized(2))
    config.enable_word_time_offsets = False
    async with running_server(engine) as ctx:
        calls = await trio.to_thread.run_sync(riva_calls, ctx, dialogue, config)
    for results in calls:
        words = final_words(results)
        assert words and all(1 <= w.speaker_tag <= 2 for w in words)
        assert " ".join(w.word for w in words) == final_text(results)


async def test_riva_refuses_a_negative_max_speaker_count(engine, dialogue):
    import grpc
    import trio

    async with running_server(engine) as ctx:
        refused = await trio.to_thread.run_sync(riva_calls, ctx, dialogue, riva_config(**diarized(-1)))
        served = await trio.to_thread.run_sync(riva_calls, ctx, dialogue, riva_config(**diarized(2)))
    for error in refused:
        assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_speaker_count" in error.details()
    assert all(final_words(results) for results in served)


async def test_riva_without_a_diarizer_refuses_diarization_and_serves_the_rest(plain_engine, dialogue):
    import grpc
    import trio

    async with running_server(plain_engine) as ctx:
        refused = await trio.to_thread.run_sync(riva_calls, ctx, dialogue, riva_config(**diarized(2)))
        served = await trio.to_thread.run_sync(riva_calls, ctx, dialogue, riva_config())
        counted = metric(ctx.metrics.render(), 'parakeet_errors_total{code="diarization_unavailable"}')
    for error in refused:
        assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "--diarizer" in error.details()
    assert counted == len(refused)
    for results in served:
        assert final_text(results) and all(w.speaker_tag == 0 for w in final_words(results))


def livekit_speakers(port: int, samples: np.ndarray, most: int) -> list[tuple[str, str | None]]:
    """LiveKit Agents' NVIDIA plugin with diarization, fed 20 ms frames then ended: (text, speaker_id) per final."""
    import asyncio

    from livekit import rtc
    from livekit.agents.stt import SpeechEventType
    from livekit.plugins import nvidia

    pcm = encode_audio(samples, "pcm16")

    async def main() -> list[tuple[str, str | None]]:
        stt = nvidia.STT(server=f"127.0.0.1:{port}", use_ssl=False, enable_diarization=True, max_speaker_count=most)
        stream = stt.stream()
        for frame in (pcm[i : i + 640] for i in range(0, len(pcm), 640)):
            stream.push_frame(rtc.AudioFrame(frame, 16000, 1, len(frame) // 2))
        stream.end_input()
        finals = [(e.alternatives[0].text, e.alternatives[0].speaker_id) async for e in stream
                  if e.type == SpeechEventType.FINAL_TRANSCRIPT]
        await stt.aclose()
        return finals

    return asyncio.run(asyncio.wait_for(main(), 60))


async def test_livekit_nvidia_plugin_gets_speakers(engine, dialogue):
    pytest.importorskip("livekit.plugins.nvidia")  # plugins register on the main thread, as at an agent's import
    import trio

    async with running_server(engine) as ctx:
        finals = await trio.to_thread.run_sync(livekit_speakers, ctx.config.ports["grpc"], dialogue, 2)
        streaming, _ = await trio.to_thread.run_sync(riva_calls, ctx, dialogue, riva_config(**diarized(2)))
    want = []  # the plugin's speaker_id: "S" and the final's most frequent speaker_tag
    for final in (r.alternatives[0] for r in streaming if r.is_final):
        want.append((final.transcript, f"S{Counter(w.speaker_tag for w in final.words).most_common(1)[0][0]}"))
    assert len(finals) >= 2 and finals == want


# -- OpenAI's file transcriptions, through the official SDK --------------------------------------


def openai_transcribe(ctx, samples: np.ndarray, **params):
    import openai
    from helpers import audio_file

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{ctx.config.ports['http']}/v1", api_key="unused", max_retries=0)
    return client.audio.transcriptions.create(file=("dialogue.wav", audio_file(samples)), **params)


def turns(words: list, utterances: list, speaker_of) -> list[tuple[int, str]]:
    """(speaker, text) of each run of one speaker's words inside one utterance (`utterances`: their spans)."""
    out: list[tuple[int, str, int]] = []
    for w in words:
        utterance = next(i for i, u in enumerate(utterances) if u.start - 1e-6 <= w.start <= u.end + 1e-6)
        speaker = speaker_of(w)
        if out and out[-1][0] == speaker and out[-1][2] == utterance:
            out[-1] = (speaker, f"{out[-1][1]} {w.word}", utterance)
        else:
            out.append((speaker, w.word, utterance))
    return [(speaker, text) for speaker, text, _ in out]


async def test_openai_diarized_json_gives_speaker_turns_of_the_offline_speakers(engine, sortformer, dialogue):
    pytest.importorskip("openai")
    import trio

    probs = offline(sortformer, dialogue)
    async with running_server(engine) as ctx:
        diarized = await trio.to_thread.run_sync(lambda: openai_transcribe(
            ctx, dialogue, model="gpt-4o-transcribe-diarize", response_format="diarized_json",
            chunking_strategy="auto"))
        verbose = await trio.to_thread.run_sync(lambda: openai_transcribe(
            ctx, dialogue, model="whisper-1", response_format="verbose_json",
            timestamp_granularities=["word", "segment"]))
    assert type(diarized).__name__ == "TranscriptionDiarized"  # the SDK parsed it as OpenAI's diarized answer
    want = turns(verbose.words, verbose.segments, lambda w: word_speaker(probs, w.start, w.end, 4))
    names = {speaker: chr(65 + k) for k, speaker in enumerate(dict.fromkeys(s for s, _ in want))}
    assert [(s.speaker, s.text) for s in diarized.segments] == [(names[s], text) for s, text in want]
    assert len(names) > 1 and diarized.text == verbose.text  # the fixture tells the voices apart
    assert [s.id for s in diarized.segments] == [f"seg_{i}" for i in range(len(want))]
    assert all(s.type == "transcript.text.segment" and s.start <= s.end for s in diarized.segments)


async def test_openai_stream_sends_each_speaker_turn_as_it_completes(engine, dialogue):
    pytest.importorskip("openai")
    import trio

    long = np.concatenate([dialogue, np.zeros(8000, np.float32), dialogue])  # several utterances
    async with running_server(engine) as ctx:
        whole = await trio.to_thread.run_sync(lambda: openai_transcribe(
            ctx, long, model="gpt-4o-transcribe-diarize", response_format="diarized_json"))
        events = await trio.to_thread.run_sync(lambda: list(openai_transcribe(
            ctx, long, model="gpt-4o-transcribe-diarize", response_format="diarized_json", stream=True)))
    kinds = [e.type for e in events]
    segments = [e for e in events if e.type == "transcript.text.segment"]
    assert [s.model_dump() for s in segments] == [s.model_dump() for s in whole.segments]
    assert kinds[-1] == "transcript.text.done" and events[-1].text == whole.text
    # a turn comes once it is complete, before the text of the utterances after it
    assert kinds.index("transcript.text.segment") < len(kinds) - 1 - kinds[::-1].index("transcript.text.delta")


async def test_openai_subtitles_of_the_diarizing_model_name_each_cues_speaker(engine, plain_engine, dialogue):
    pytest.importorskip("openai")
    import webvtt
    import trio

    async with running_server(engine) as ctx:
        vtt = await trio.to_thread.run_sync(lambda: openai_transcribe(
            ctx, dialogue, model="gpt-4o-transcribe-diarize", response_format="vtt"))
        plain = await trio.to_thread.run_sync(lambda: openai_transcribe(
            ctx, dialogue, model="whisper-1", response_format="vtt"))
    voices = [c.voice for c in webvtt.from_string(vtt).captions]
    assert len(set(voices)) > 1 and voices[0] == "A" and None not in voices
    assert all(c.voice is None for c in webvtt.from_string(plain).captions)


async def test_openai_without_a_diarizer_refuses_diarized_json_and_serves_the_rest(plain_engine, dialogue):
    pytest.importorskip("openai")
    import openai
    import trio

    async with running_server(plain_engine) as ctx:
        with pytest.raises(openai.BadRequestError) as error:
            await trio.to_thread.run_sync(lambda: openai_transcribe(
                ctx, dialogue, model="gpt-4o-transcribe-diarize", response_format="diarized_json"))
        srt = await trio.to_thread.run_sync(lambda: openai_transcribe(
            ctx, dialogue, model="gpt-4o-transcribe-diarize", response_format="srt"))
    body = error.value.body
    assert body["code"] == "diarization_unavailable" and body["param"] == "response_format"
    assert "--diarizer" in body["message"] and srt.strip() and "[A]" not in srt


# -- parakeet-transcribe --------------------------------------------------------------------------


def test_transcribe_gives_each_word_its_speaker_in_json_subtitles_and_text(sortformer, dialogue, tmp_path):
    import json
    import subprocess
    import sys

    import webvtt
    from helpers import audio_file

    wav = tmp_path / "dialogue.wav"
    wav.write_bytes(audio_file(dialogue))

    def transcribe(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "parakeet_stream.tools.transcribe", str(wav), "--model", "demo",
                               "--diarizer", str(SORTFORMER), "--dtype", "float32", *args],  # (auto: the fastest, by a timing)
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    probs = offline(sortformer, dialogue)
    words = json.loads(transcribe("--format", "json"))["words"]
    assert words and [w["speaker"] for w in words] == [word_speaker(probs, w["start"], w["end"], 4) for w in words]
    voices = [c.voice for c in webvtt.from_string(transcribe("--format", "vtt")).captions]
    assert len(set(voices)) > 1 and voices[0] == "A"
    name, *turns = transcribe().splitlines()
    assert name == f"{wav}:" and all(t.startswith("[") for t in turns)
    assert list(dict.fromkeys(t[1 : t.index("]")] for t in turns)) == list(dict.fromkeys(voices))
    assert " ".join(t.split("] ", 1)[1] for t in turns) == " ".join(w["word"] for w in words)
    refused = subprocess.run([sys.executable, "-m", "parakeet_stream.tools.transcribe", str(wav), "--diarizer",
                              str(tmp_path / "missing.nemo")], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "missing.nemo: no such file" in refused.stderr

"""The demo diarizer: its training pieces (conversation labels, the .nemo it writes loading back
through the same reader as NVIDIA's checkpoints) and the bundled one telling voices apart."""

from __future__ import annotations

import dataclasses
import random
import shutil

import numpy as np
import pytest
import torch
from helpers import collect_until_final, pcm16_exact

from demo_model.conversations import FRAME, HOP, Conversations, Utterance, activity
from demo_model.speech import synth
from demo_model.train_diarizer import CONFIG, SPEAKERS, der, export, loss_of, stream
from parakeet_stream.engine import ASREngine
from parakeet_stream.model.config import EncoderConfig
from parakeet_stream.model.sortformer import Sortformer
from parakeet_stream.server.streams.speakers import SpeakerTimeline
from parakeet_stream.server.streams.words import WordTracker

RATE = 16000


def tone(seconds: float, hz: float, silence: float = 0.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    quiet = np.zeros(int(silence * RATE), np.float32)
    return np.concatenate([quiet, (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32), quiet])


def test_activity_marks_the_speech_and_closes_short_gaps():
    x = np.concatenate([tone(0.5, 200, silence=0.3), tone(0.4, 300)])  # 0.6 s of silence between two
    on = activity(x)
    assert not on[:25].any() and on[35:75].all()  # silence, then the first burst
    assert not on[85:105].any()  # a 0.6 s gap stays a gap
    short = activity(np.concatenate([tone(0.3, 200), np.zeros(int(0.1 * RATE), np.float32), tone(0.3, 200)]))
    assert short[: int(0.7 * RATE) // HOP - 1].all()  # a 0.1 s gap is a pause inside speech


def test_conversation_labels_number_speakers_by_first_speech():
    voices = [Utterance(v, tone(1.0, 150 + 100 * v), activity(tone(1.0, 150 + 100 * v))) for v in range(3) for _ in range(2)]
    convs = Conversations(voices, SPEAKERS, seconds=6.0)
    for seed in range(20):
        audio, labels = convs.draw(random.Random(seed), speakers=2)
        assert labels.shape == (-(-audio.size // FRAME), SPEAKERS)
        firsts = [np.flatnonzero(labels[:, k])[0] for k in range(2)]
        assert firsts[0] < firsts[1]  # the first to speak is speaker 0
        assert not labels[:, 2:].any()  # two voices: two columns used
        assert labels[: firsts[0]].sum() == 0


def test_der_counts_misses_false_alarms_and_confusions_under_the_best_mapping():
    ref = np.zeros((10, SPEAKERS), np.float32)
    ref[:5, 0], ref[5:, 1] = 1, 1
    swapped = ref[:, [1, 0, 2, 3]]  # the same turns, speakers named the other way round
    assert der(swapped, ref) == (0.0, 10.0)
    wrong = ref.copy()
    wrong[4, 0], wrong[4, 1] = 0, 1  # one frame given to the other speaker
    wrong[9, 2] = 1  # one false speaker
    assert der(wrong, ref) == (2.0, 10.0)


def test_exported_model_loads_as_nvidias_do_and_gives_the_same_speakers(tmp_path):
    small = dataclasses.replace(CONFIG, encoder=dataclasses.replace(CONFIG.encoder, n_layers=1, d_model=32,
                                                                      subsampling_channels=16), tf_layers=1, tf_d_model=32, tf_inner=64)
    torch.manual_seed(0)
    model = Sortformer(small).eval()
    for p in model.parameters():  # half-precision weights in the file: compare at values it keeps
        p.data = p.data.half().float()
    path = tmp_path / "diarizer.nemo"
    export(model, path)
    loaded = Sortformer.from_nemo(path)
    assert loaded.cfg == small
    audio = np.concatenate([tone(1.0, 200, silence=0.2), tone(1.5, 330)])
    np.testing.assert_allclose(stream(loaded, audio), stream(model, audio), atol=1e-5)


def test_a_training_step_lowers_the_loss_on_its_batch():
    small = dataclasses.replace(CONFIG, encoder=EncoderConfig(feat_in=80, n_layers=1, d_model=32, n_heads=4, subsampling_channels=16,
                                                              xscaling=True, use_bias=True, att_context_sizes=((-1, -1),)),
                                tf_layers=1, tf_d_model=32, tf_inner=64)
    torch.manual_seed(0)
    model = Sortformer(small)
    feats = torch.randn(2, 400, 80)
    lengths = torch.tensor([400, 300])
    labels = torch.zeros(2, 50, SPEAKERS)
    labels[0, :20, 0], labels[1, 10:, 1] = 1, 1
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = loss_of(model, feats, lengths, labels)
    for _ in range(20):
        loss = loss_of(model, feats, lengths, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first.item()


TURNS = [("en-us", "the weather today is cold and windy in the north"),
         ("en-us+f3", "she would like to book a table for two people tonight"),
         ("en-us", "then we should leave before the train arrives"),
         ("en-us+f3", "the station is only a short walk from here"),
         ("en-us", "good let me find my coat and my umbrella"),
         ("en-us+f3", "it will be raining by the time we get there")]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
def test_the_bundled_demo_diarizer_gives_each_turn_of_a_dialogue_its_speaker():
    """`--diarizer demo` as a user starts it: two voices taking six turns, each voice keeping its
    number to the end (the diarizer bundled before gave the sixth turn's words to the first voice)."""
    pause, parts, spans, at = np.zeros(RATE // 2, np.float32), [], [], 0.0
    for i, (voice, text) in enumerate(TURNS):
        samples = pcm16_exact(synth({"voice": voice, "variant": "default", "speed": 160, "pitch": 50, "text": text}, seed=i))
        parts += [samples, pause]
        spans.append((at, at + samples.size / RATE))
        at += (samples.size + pause.size) / RATE
    with ASREngine("demo", diarizer="demo", max_num_streams=2) as engine:
        words = native_words(engine, np.concatenate(parts))
    by_turn = [[w["speaker"] for w in words if a - 0.1 <= (w["start"] + w["end"]) / 2 <= b + 0.1] for a, b in spans]
    assert all(len(speakers) >= 6 for speakers in by_turn), by_turn
    for turn, speakers in enumerate(by_turn):  # numbered in the order they first spoke
        expected = turn % 2
        assert speakers.count(expected) >= 0.9 * len(speakers), by_turn


def native_words(engine: ASREngine, audio: np.ndarray) -> list[dict]:
    """The stream's words with their speakers, made as the native protocol makes them."""
    sid = engine.create_stream(diarize=True)
    for i in range(0, audio.size, 2560):
        engine.push_audio(sid, audio[i : i + 2560])
    engine.finalize(sid)
    tracker, speakers, words = WordTracker(engine.info), SpeakerTimeline(engine.info, engine.info.speakers), []
    for result in collect_until_final(engine, sid):
        speakers.add(result)
        words += speakers.label(tracker.update(result, result.audio_seconds, close=result.is_final))
    return words

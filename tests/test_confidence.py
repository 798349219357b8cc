"""Confidence from the model: each token's probability under the joint (model/greedy.py), words the
lowest of their tokens', transcripts the mean of their words' (server/streams/words.py).

The end-to-end check: over the demo model's held-out sentences (espeak-ng speech, as in
test_demo_model.py), hypothesis words aligned to the reference (edit distance): the words the model
gets wrong carry a lower mean confidence than the ones it gets right.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from benchmarks.kernels.frame_looping import frame_looping
from helpers import demo_pins, run_stream
from test_demo_model import DEMO, FIXTURE, synth
from test_greedy import random_decoder

from parakeet_stream.model.greedy import GreedyPass, eou_probabilities, unpack_scored
from parakeet_stream.server.streams.words import WordTracker, transcript_confidence, word_confidence
from parakeet_stream.training.data import aligned_right


def replayed_probabilities(decoder, enc: torch.Tensor, state, b: int, stream) -> list[float]:
    """Stream b's labels replayed one by one: the softmax probability of each at its frame."""
    f = decoder.joint.enc(enc[b])
    h, c, g = state.h[:, b : b + 1], state.c[:, b : b + 1], state.g[b]
    probs = []
    for label, frame, _ in stream:
        probs.append(float(decoder.joint(f[frame], g).softmax(-1)[label]))
        out, (h, c) = decoder.predictor.step(torch.tensor([label]), h, c)
        g = decoder.joint.pred(out)[0]
    return probs


@pytest.mark.parametrize("blank_bias", [-3.0, 0.0])
def test_one_probability_per_label_the_joints_softmax_at_its_frame(blank_bias):
    decoder = random_decoder(blank_bias)
    gen = torch.Generator().manual_seed(1)
    enc, lengths = torch.randn(4, 11, 32, generator=gen), torch.tensor([11, 5, 0, 2])  # 2 frames: within the bound
    with torch.inference_mode():
        state = decoder.initial_state(4)
        eager = unpack_scored(GreedyPass(decoder, enc, lengths, state).run().scored().numpy())
        bounded = GreedyPass(decoder, enc, lengths, state).run(fixed=True)  # as a CUDA graph runs it
        fixed, finished = unpack_scored(bounded.scored().numpy()), (~bounded.active).tolist()
        labels, _ = frame_looping(decoder, enc, lengths, state)
        for b, stream in enumerate(eager):
            assert [(label, frame) for label, frame, _ in stream] == labels[b]  # labels untouched
            probs = [p for _, _, p in stream]
            assert all(0 < p <= 1 for p in probs)
            assert probs == pytest.approx(replayed_probabilities(decoder, enc, state, b, stream), abs=1e-5)
            if finished[b]:  # a row the bounded pass left unfinished is decoded again by the runner
                assert probs == pytest.approx([p for _, _, p in fixed[b]], abs=1e-6)
    assert eager[2] == [] and sum(map(len, eager)) > 0 and any(f and fixed[b] for b, f in enumerate(finished))


def replayed_eou(decoder, enc: torch.Tensor, length: int, state, b: int, eou: int) -> float:
    """Stream b decoded frame by frame: the highest probability of `eou` over the (frame, state)
    pairs scored after its last label other than `eou`."""
    f = decoder.joint.enc(enc[b])
    h, c, g = state.h[:, b : b + 1], state.c[:, b : b + 1], state.g[b]
    best, t, symbols = 0.0, 0, 0
    while t < length:
        probs = decoder.joint(f[t], g).softmax(-1)
        best, label = max(best, float(probs[eou])), int(probs.argmax())
        if label == decoder.blank:
            t, symbols = t + 1, 0
            continue
        best = best if label == eou else 0.0
        out, (h, c) = decoder.predictor.step(torch.tensor([label]), h, c)
        g, symbols = decoder.joint.pred(out)[0], symbols + 1
        if symbols >= decoder.cfg.max_symbols:
            t, symbols = t + 1, 0
    return best


@pytest.mark.parametrize("blank_bias", [-3.0, 3.0, 6.0])
def test_end_of_utterance_probability_since_the_last_other_label(blank_bias):
    decoder, eou = random_decoder(blank_bias), 4
    gen = torch.Generator().manual_seed(2)
    enc, lengths = torch.randn(5, 11, 32, generator=gen), torch.tensor([11, 5, 0, 8, 1])
    with torch.inference_mode():
        state = decoder.initial_state(5)
        eager = GreedyPass(decoder, enc, lengths, state, eou=eou).run()
        fixed = GreedyPass(decoder, enc, lengths, state, eou=eou).run(fixed=True)
        found = eou_probabilities(eager.scored().numpy())
        expected = [replayed_eou(decoder, enc, int(n), state, b, eou) for b, n in enumerate(lengths)]
        assert found == pytest.approx(expected, abs=1e-5)
        finished = (~fixed.active).tolist()
        assert [p for p, f in zip(found, finished) if f] == pytest.approx(
            [p for p, f in zip(eou_probabilities(fixed.scored().numpy()), finished) if f], abs=1e-6)
        assert unpack_scored(eager.scored().numpy()) == unpack_scored(GreedyPass(decoder, enc, lengths, state).run().scored().numpy())
        assert eou_probabilities(GreedyPass(decoder, enc, lengths, state).run().scored().numpy()) == [0.0] * 5
    assert found[2] == 0.0 and (blank_bias < 0 or any(p > 0 for p in found)), found


def test_a_word_takes_its_lowest_token_a_transcript_the_mean_of_its_words():
    assert word_confidence([(1, 0.0, 0.9), (2, 0.1, 0.4), (3, 0.2, 0.7)]) == 0.4
    words = [{"confidence": 0.4}, {"confidence": 0.8}, {"confidence": 0.9}]
    assert transcript_confidence(words) == pytest.approx(0.7) and transcript_confidence([]) == 0.0


def test_alignment_marks_substitutions_and_insertions_wrong():
    assert aligned_right("the quick brown fox".split(), "the quick brawn fox".split()) == [True, True, False, True]
    assert aligned_right("a b c".split(), "a x b c".split()) == [True, False, True, True]
    assert aligned_right("a b c".split(), "a c".split()) == [True, True]


def word_confidences(engine, sentences: dict) -> tuple[list[float], list[float]]:
    """The confidences of the words an engine gets right and of those it gets wrong, over the fixture's
    sentences streamed."""
    right, wrong = [], []
    for name in ("seen_voices", "heldout_voices"):
        for k, item in enumerate(sentences[name]):
            results = run_stream(engine, synth(item, seed=k))
            tracker = WordTracker(engine.info)
            words = [w for r in results for w in tracker.update(r, r.audio_seconds, close=r.is_final)]
            for word, ok in zip(words, aligned_right(item["text"].split(), [w["word"] for w in words])):
                (right if ok else wrong).append(word["confidence"])
    return right, wrong


@pytest.mark.skipif(not (DEMO / "model.safetensors").is_file() or shutil.which("espeak-ng") is None,
                    reason="needs weights/demo and espeak-ng (see test_demo_model.py)")
def test_words_the_demo_model_gets_wrong_have_lower_confidence():
    from parakeet_stream.engine import ASREngine

    with ASREngine("demo", max_num_streams=8) as engine:
        right, wrong = word_confidences(engine, json.loads(FIXTURE.read_text()))
    assert all(0 < c <= 1 for c in right + wrong)
    mean_right, mean_wrong = np.mean(right), np.mean(wrong)
    print(f"right words: {len(right)}, mean confidence {mean_right:.4f}; "
          f"wrong words: {len(wrong)}, mean confidence {mean_wrong:.4f}")
    pinned = demo_pins()["confidence"]  # the bundled model's own figures; the bar keeps half its gap
    assert len(wrong) >= pinned["words_wrong"] // 2
    assert mean_wrong < mean_right - (pinned["right"] - pinned["wrong"]) / 2

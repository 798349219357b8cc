"""The pre-encode stage's chunker: cut sizes, first-chunk padding, history, the partial last chunk,
and one definition of a ready chunk: the samples the inbox counts agree with the frames cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from parakeet_stream.engine import chunker
from parakeet_stream.engine.chunker import FrontEnd
from parakeet_stream.engine.inbox import Inbox, SampleBuffer
from parakeet_stream.model.config import FeatureConfig
from parakeet_stream.model.conformer import chunk_spec
from parakeet_stream.model.features import LogMelFeatures

FEATURES = LogMelFeatures(FeatureConfig())
N_MELS = FEATURES.cfg.n_mels


def numbered(spec, frames: int) -> FrontEnd:
    """A front end holding `frames` mel frames; frame i (0-based) is filled with i + 1, so 0 is padding."""
    front = FrontEnd(FEATURES, spec)
    chunker.add_features(FEATURES, [front], [torch.zeros(0)], [False])
    front.mel = np.concatenate((front.mel, more(0, frames)))
    return front


def more(start: int, frames: int) -> np.ndarray:
    return np.repeat(np.arange(start + 1, start + frames + 1, dtype=np.float32)[:, None], N_MELS, axis=1)


def ids(rows: np.ndarray) -> list[int]:
    return [int(v) for v in rows[:, 0]]


def test_first_chunk_is_left_padded_to_the_window():
    spec = chunk_spec((70, 1), 8)  # first 9 frames, later 16, pre-encode cache 9
    front = numbered(spec, 30)
    (w,) = chunker.cut(front, 1, last=False)
    assert w.frames.shape == (spec.window, N_MELS) == (25, N_MELS)
    assert (w.start, w.length) == (spec.first_pad, spec.first_frames) == (16, 9)
    assert ids(w.frames) == [0] * 16 + list(range(1, 10))
    assert ids(front.history) == list(range(1, 10))
    assert front.chunks_cut == 1 and front.mel.shape[0] == 21


def test_later_chunks_carry_the_previous_frames_and_only_whole_ones_are_cut():
    spec = chunk_spec((70, 1), 8)
    front = numbered(spec, 30)
    windows = chunker.cut(front, 5, last=False)
    assert len(windows) == 2  # 9 + 16 frames; the 5 left wait for more
    w = windows[1]
    assert (w.start, w.length) == (0, spec.window)
    assert ids(w.frames) == list(range(1, 26))  # history (1..9), then its own 16 frames
    assert ids(front.history) == list(range(17, 26))
    front.mel = np.concatenate((front.mel, more(30, 11)))
    assert [ids(w.frames)[-1] for w in chunker.cut(front, 5, last=False)] == [41]


def test_cut_takes_at_most_count_chunks():
    spec = chunk_spec((70, 1), 8)
    front = numbered(spec, 9 + 16 * 4)
    assert len(chunker.cut(front, 2, last=False)) == 2
    assert len(chunker.cut(front, 0, last=False)) == 0
    assert len(chunker.cut(front, 9, last=False)) == 3


def test_history_of_a_first_chunk_shorter_than_the_cache_is_zero_padded():
    spec = chunk_spec((70, 0), 8)  # first chunk: one frame
    front = numbered(spec, 1 + 8)
    first, second = chunker.cut(front, 2, last=False)
    assert ids(first.frames) == [0] * 16 + [1] and (first.start, first.length) == (16, 1)
    assert ids(second.frames) == [0] * 8 + [1] + list(range(2, 10))


@pytest.mark.parametrize("left,kept", [(8, True), (12, True), (7, False)])
def test_the_partial_last_chunk_is_kept_from_one_subsampling_step(left, kept):
    spec = chunk_spec((70, 1), 8)
    front = numbered(spec, 9 + left)
    assert len(chunker.cut(front, 2, last=False)) == 1
    rest = chunker.cut(front, 0, last=True)
    assert len(rest) == kept
    if kept:
        (w,) = rest
        assert (w.start, w.length) == (0, spec.pre_cache + left)
        assert ids(w.frames) == list(range(1, 10 + left)) + [0] * (16 - left)


@pytest.mark.parametrize("frames", [1, 5])
def test_a_short_stream_is_one_partial_first_chunk(frames):
    spec = chunk_spec((70, 1), 8)
    (w,) = chunker.cut(numbered(spec, frames), 0, last=True)
    assert (w.start, w.length) == (spec.first_pad, frames)


def test_the_last_features_are_zero_masked_past_samples_over_hop():
    front = FrontEnd(FEATURES, chunk_spec((70, 1), 8))
    n = 1000
    chunker.add_features(FEATURES, [front], [torch.randn(n)], [True])
    valid = n // FEATURES.cfg.hop_length
    assert front.mel.shape[0] == valid + 1
    assert bool((front.mel[valid:] == 0).all()) and bool((front.mel[:valid] != 0).all())


def _modes(models):
    return [(m, mode) for m in models for mode in m.cfg.encoder.att_context_sizes]


@pytest.fixture(scope="module")
def model_modes(eou_model, nemotron_model):
    return _modes([eou_model, nemotron_model])


def _start(model, mode) -> tuple[Inbox, FrontEnd]:
    spec, fcfg = model.encoder.chunk_spec(mode), model.cfg.features
    return Inbox(spec, fcfg.hop_length, fcfg.n_fft), FrontEnd(model.features, spec)


def _frame(model, inbox: Inbox, front: FrontEnd, upto: int | None = None, last: bool = False) -> None:
    chunker.add_features(model.features, [front], [inbox.take_samples(upto)], [last])


def test_a_chunk_is_ready_in_samples_exactly_when_its_frames_are_there(model_modes):
    rng = np.random.default_rng(0)
    for model, mode in model_modes:
        inbox, front = _start(model, mode)
        for k in range(5):
            short = inbox.samples_for(k) - 1 - inbox.samples_in
            inbox.add(rng.standard_normal(short).astype(np.float32))
            _frame(model, inbox, front)
            assert inbox.chunks_ready == k and len(chunker.cut(front, 9, last=False)) == 0, (mode, k)
            inbox.add(rng.standard_normal(1).astype(np.float32))
            _frame(model, inbox, front)
            assert inbox.chunks_ready == k + 1 and len(chunker.cut(front, 9, last=False)) == 1, (mode, k)


def test_a_backlog_framed_up_to_a_chunk_cuts_exactly_up_to_it(model_modes):
    for model, mode in model_modes:
        inbox, front = _start(model, mode)
        inbox.add(np.zeros(inbox.samples_for(6) + 500, np.float32))
        _frame(model, inbox, front, upto=inbox.samples_for(2))
        assert len(chunker.cut(front, 9, last=False)) == 3, mode
        _frame(model, inbox, front, upto=inbox.samples_for(4))
        assert len(chunker.cut(front, 9, last=False)) == 2, mode


def test_at_the_end_every_ready_chunk_is_cut_whole(model_modes):
    for model, mode in model_modes:
        spec = model.encoder.chunk_spec(mode)
        base = Inbox(spec, model.cfg.features.hop_length, model.cfg.features.n_fft)
        for n in range(base.samples_for(1) - 400, base.samples_for(2) + 400, 37):
            inbox, front = _start(model, mode)
            inbox.add(np.full(n, 0.1, np.float32))
            _frame(model, inbox, front, last=True)
            windows = chunker.cut(front, 0, last=True)
            assert len(windows) >= inbox.chunks_ready, (mode, n)
            full = [spec.first_frames] + [spec.window] * (len(windows) - 1)
            assert [w.length for w in windows[: inbox.chunks_ready]] == full[: inbox.chunks_ready], (mode, n)


def test_the_inbox_sample_buffer_gives_back_exactly_what_was_pushed_in_order():
    """Pushes and takes of any sizes, backlogs grown and given back: the samples come out as they
    went in (taking moves a mark; what is left moves only when a push needs the room)."""
    rng = np.random.default_rng(7)
    buffer, expected = SampleBuffer(), np.zeros(0, np.float32)
    for _ in range(5000):
        if rng.random() < 0.55:
            samples = rng.standard_normal(int(rng.integers(0, 5000))).astype(np.float32)
            buffer.append(samples)
            expected = np.concatenate((expected, samples))
        else:
            n = None if rng.random() < 0.1 else int(rng.integers(0, 6000))
            got = buffer.take(n)
            assert np.array_equal(got, expected[: len(got)]) and len(got) == min(len(expected), n or len(expected))
            expected = expected[len(got):]
        assert len(buffer) == len(expected)

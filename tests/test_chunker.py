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


class Numbered:
    """One stream's front end fed numbered mel frames: frame i (0-based) is filled with i + 1, so 0 is
    padding. Each call is one step of the engine's: new frames laid out with the carried ones, cut, kept."""

    def __init__(self, spec, frames: int = 0):
        self.store, self.front, self.frames = chunker.FrontEnds(FEATURES, 1), FrontEnd(FEATURES, spec), 0
        self.cut(0, last=False, more=frames)

    def cut(self, count: int, last: bool, more: int = 0) -> list[tuple[list[int], int, int]]:
        """`more` new frames, then the next `count` chunks: (frame ids, valid start, valid length) of each."""
        mel = torch.arange(self.frames + 1, self.frames + more + 1, dtype=torch.float32)[:, None].repeat(1, N_MELS)
        self.frames += more
        rows = self.store.lay_out([self.front], [0], mel, np.array([more]))
        windows = self.store.cut([self.front], rows, [0], [count], [last])
        self.store.keep([self.front], [0], rows)
        if windows is None:
            return []
        return [(ids(w), s, n) for w, s, n in zip(windows.frames.numpy(), windows.start.tolist(), windows.length.tolist())]

    @property
    def history(self) -> list[int]:
        return ids(self.store.carry[0, : self.front.spec.pre_cache].numpy())

    @property
    def waiting(self) -> int:
        """Frames not cut yet."""
        return int(self.store.carried[0]) - self.front.spec.pre_cache


def ids(rows: np.ndarray) -> list[int]:
    return [int(v) for v in rows[:, 0]]


def test_first_chunk_is_left_padded_to_the_window():
    spec = chunk_spec((70, 1), 8)  # first 9 frames, later 16, pre-encode cache 9
    stream = Numbered(spec, 30)
    ((frames, start, length),) = stream.cut(1, last=False)
    assert len(frames) == spec.window == 25
    assert (start, length) == (spec.first_pad, spec.first_frames) == (16, 9)
    assert frames == [0] * 16 + list(range(1, 10))
    assert stream.history == list(range(1, 10))
    assert stream.store.chunks_cut[0] == 1 and stream.waiting == 21


def test_later_chunks_carry_the_previous_frames_and_only_whole_ones_are_cut():
    spec = chunk_spec((70, 1), 8)
    stream = Numbered(spec, 30)
    windows = stream.cut(5, last=False)
    assert len(windows) == 2  # 9 + 16 frames; the 5 left wait for more
    frames, start, length = windows[1]
    assert (start, length) == (0, spec.window)
    assert frames == list(range(1, 26))  # history (1..9), then its own 16 frames
    assert stream.history == list(range(17, 26))
    assert [frames[-1] for frames, _, _ in stream.cut(5, last=False, more=11)] == [41]


def test_new_frames_and_cuts_in_one_step_read_the_carried_ones_before_them():
    spec = chunk_spec((70, 1), 8)
    stream = Numbered(spec, 9 + 5)  # the first chunk and 5 frames of the second
    stream.cut(1, last=False)
    ((frames, _, _),) = stream.cut(1, last=False, more=11)
    assert frames == list(range(1, 26))


def test_cut_takes_at_most_count_chunks():
    spec = chunk_spec((70, 1), 8)
    stream = Numbered(spec, 9 + 16 * 4)
    assert len(stream.cut(2, last=False)) == 2
    assert len(stream.cut(0, last=False)) == 0
    assert len(stream.cut(9, last=False)) == 3


def test_history_of_a_first_chunk_shorter_than_the_cache_is_zero_padded():
    spec = chunk_spec((70, 0), 8)  # first chunk: one frame
    first, second = Numbered(spec, 1 + 8).cut(2, last=False)
    assert first == ([0] * 16 + [1], 16, 1)
    assert second[0] == [0] * 8 + [1] + list(range(2, 10))


@pytest.mark.parametrize("left,kept", [(8, True), (12, True), (7, False)])
def test_the_partial_last_chunk_is_kept_from_one_subsampling_step(left, kept):
    spec = chunk_spec((70, 1), 8)
    stream = Numbered(spec, 9 + left)
    assert len(stream.cut(2, last=False)) == 1
    rest = stream.cut(0, last=True)
    assert len(rest) == kept
    if kept:
        ((frames, start, length),) = rest
        assert (start, length) == (0, spec.pre_cache + left)
        assert frames == list(range(1, 10 + left)) + [0] * (16 - left)


@pytest.mark.parametrize("frames", [1, 5])
def test_a_short_stream_is_one_partial_first_chunk(frames):
    spec = chunk_spec((70, 1), 8)
    ((_, start, length),) = Numbered(spec, frames).cut(0, last=True)
    assert (start, length) == (spec.first_pad, frames)


def test_streams_of_a_step_keep_their_own_timelines_whatever_slot_they_hold():
    """Three streams in slots 2, 0 and 1 of a pool of 4, their frames laid out together step by step
    (new frames of one, none of another): every window holds its own stream's frames, in order."""
    spec = chunk_spec((70, 1), 8)
    store, fronts, slots = chunker.FrontEnds(FEATURES, 4), [FrontEnd(FEATURES, spec) for _ in range(3)], [2, 0, 1]
    made, seen = [0, 0, 0], [[], [], []]
    for more in [(20, 3, 0), (16, 30, 25), (7, 16, 15)]:
        parts = []
        for s, n in enumerate(more):  # stream s's frame i is 1000 (s + 1) + i: where a row came from shows
            parts.append(torch.arange(1, n + 1, dtype=torch.float32) + made[s] + 1000 * (s + 1))
            made[s] += n
        rows = store.lay_out(fronts, slots, torch.cat(parts)[:, None].repeat(1, N_MELS), np.array(more))
        windows = store.cut(fronts, rows, [0, 1, 2], [9, 9, 9], [False] * 3)
        store.keep(fronts, slots, rows)
        for w, owner in zip(windows.frames.numpy(), windows.owner.tolist()):
            seen[owner].append([i for i in ids(w) if i])
    for s in range(3):
        cut = 9 + 16 * (len(seen[s]) - 1)
        assert seen[s][0] == [1000 * (s + 1) + i for i in range(1, 10)], s
        assert seen[s][-1] == [1000 * (s + 1) + i for i in range(cut - 24, cut + 1)], s
    assert store.chunks_cut[slots].tolist() == [3, 3, 2]


def test_the_last_features_are_zero_masked_past_samples_over_hop():
    front, n = FrontEnd(FEATURES, chunk_spec((70, 1), 8)), 1000
    mel, counts = chunker.FrontEnds(FEATURES, 1).new_frames([front], [np.random.default_rng(0).standard_normal(n)], [True])
    valid = n // FEATURES.cfg.hop_length
    assert counts.tolist() == [valid + 1] and mel.shape[0] == valid + 1
    assert bool((mel[valid:] == 0).all()) and bool((mel[:valid] != 0).all())


def _modes(models):
    return [(m, mode) for m in models for mode in m.cfg.encoder.att_context_sizes]


@pytest.fixture(scope="module")
def model_modes(eou_model, nemotron_model):
    return _modes([eou_model, nemotron_model])


class Framed:
    """One stream of a model's mode through the engine's inbox and front end, a step per `frame`."""

    def __init__(self, model, mode):
        spec, fcfg = model.encoder.chunk_spec(mode), model.cfg.features
        self.inbox, self.front = Inbox(spec, fcfg.hop_length, fcfg.n_fft), FrontEnd(model.features, spec)
        self.store = chunker.FrontEnds(model.features, 1)

    def step(self, count: int = 9, upto: int | None = None, last: bool = False) -> list[int]:
        """Frame what the inbox has (up to sample `upto`), cut up to `count` chunks: their valid lengths."""
        new = self.store.new_frames([self.front], [self.inbox.take_samples(upto)], [last])
        rows = self.store.lay_out([self.front], [0], *new)
        windows = self.store.cut([self.front], rows, [0], [count], [last])
        self.store.keep([self.front], [0], rows)
        return [] if windows is None else windows.length.tolist()


def test_a_chunk_is_ready_in_samples_exactly_when_its_frames_are_there(model_modes):
    rng = np.random.default_rng(0)
    for model, mode in model_modes:
        stream = Framed(model, mode)
        inbox = stream.inbox
        for k in range(5):
            short = inbox.samples_for(k) - 1 - inbox.samples_in
            inbox.add(rng.standard_normal(short).astype(np.float32))
            assert len(stream.step()) == 0 and inbox.chunks_ready == k, (mode, k)
            inbox.add(rng.standard_normal(1).astype(np.float32))
            assert len(stream.step()) == 1 and inbox.chunks_ready == k + 1, (mode, k)


def test_a_backlog_framed_up_to_a_chunk_cuts_exactly_up_to_it(model_modes):
    for model, mode in model_modes:
        stream = Framed(model, mode)
        stream.inbox.add(np.zeros(stream.inbox.samples_for(6) + 500, np.float32))
        assert len(stream.step(upto=stream.inbox.samples_for(2))) == 3, mode
        assert len(stream.step(upto=stream.inbox.samples_for(4))) == 2, mode


def test_at_the_end_every_ready_chunk_is_cut_whole(model_modes):
    for model, mode in model_modes:
        spec = model.encoder.chunk_spec(mode)
        base = Inbox(spec, model.cfg.features.hop_length, model.cfg.features.n_fft)
        for n in range(base.samples_for(1) - 400, base.samples_for(2) + 400, 37):
            stream = Framed(model, mode)
            stream.inbox.add(np.full(n, 0.1, np.float32))
            lengths = stream.step(0, last=True)
            ready = stream.inbox.chunks_ready
            assert len(lengths) >= ready, (mode, n)
            full = [spec.first_frames] + [spec.window] * (len(lengths) - 1)
            assert lengths[:ready] == full[:ready], (mode, n)


def test_the_inbox_sample_buffer_gives_back_exactly_what_was_pushed_in_order():
    """Pushes and takes of any sizes, backlogs grown and given back: the samples come out as they
    went in (taking moves a mark; what is left moves only when a push needs the room), and what
    was taken (a view, not a copy) stays as it was whatever is pushed after it."""
    rng = np.random.default_rng(7)
    buffer, expected, taken = SampleBuffer(), np.zeros(0, np.float32), []
    for _ in range(5000):
        if rng.random() < 0.55:
            samples = rng.standard_normal(int(rng.integers(0, 5000))).astype(np.float32)
            buffer.append(samples)
            expected = np.concatenate((expected, samples))
        else:
            n = None if rng.random() < 0.1 else int(rng.integers(0, 6000))
            got = buffer.take(n)
            assert np.array_equal(got, expected[: len(got)]) and len(got) == min(len(expected), n or len(expected))
            taken.append((got, got.copy()))
            expected = expected[len(got):]
        assert len(buffer) == len(expected)
    assert all(np.array_equal(got, copy) for got, copy in taken)

"""The diarize stage through static batches (engine/diarizer.py, runner/cuda_graphs.py) on CPU, with the
eager stand-in for CUDA graph replays: the same speaker probabilities and slot state as the eager
diarizer, padding rows that step only the scratch slot, and an engine that gives the same speakers.
The diarizer is the tiny random-init Sortformer fixture, with a short speaker cache and FIFO so that
a few seconds of audio overflow and compress them."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import NEMO
from helpers import diarized_speakers, varied_audios

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.diarizer import Diarizer
from parakeet_stream.model.sortformer import Sortformer
from parakeet_stream.model.sortformer_streaming import SortformerState

SLOTS, MAX_BATCH = 4, 5  # sizes 1, 2, 4, 5: a round of 3 streams has a padding row
# an update period of at least a chunk's 7 pre-encoded frames, as the live setting's: the compression's
# working width is then the eager one (sortformer_streaming.py), and equal scores keep the same frames
SHORT = dict(chunk_len=4, chunk_left_context=1, chunk_right_context=2, fifo_len=8, spkcache_len=20,
             spkcache_update_period=8)
PACKET = 3000
ATOL = 1e-4


@pytest.fixture(scope="module")
def sortformer() -> Sortformer:
    return Sortformer.from_nemo(NEMO / "sortformer_tiny.nemo")


def diarizers(sortformer: Sortformer) -> tuple[Diarizer, Diarizer]:
    """(eager, static) diarizers of the short setting; the static one's scratch slot full of NaN."""
    streaming = dataclasses.replace(sortformer.cfg.streaming, **SHORT)
    eager = Diarizer(sortformer, SLOTS, streaming)
    static = Diarizer(sortformer, SLOTS, streaming, max_batch=MAX_BATCH, graphs=True)
    static.capture()
    assert static.static.sizes == [1, 2, 4, 5] and static.graph_count == 0  # no CUDA graph on CPU
    poison(static.state, SLOTS)
    return eager, static


def poison(state: SortformerState, row: int) -> None:
    for t in (state.spkcache, state.spkcache_preds, state.fifo, state.mean_sil_emb):
        t[row] = float("nan")


def same_state(a: SortformerState, b: SortformerState, rows: slice) -> bool:
    return all(torch.allclose(getattr(a, f.name)[rows].float(), getattr(b, f.name)[rows].float(), atol=ATOL)
               for f in dataclasses.fields(a))


def padded_rounds(diarizer: Diarizer) -> list[int]:
    """Spies on the static batch's function: the rows of each replay that went to the scratch slot."""
    seen, fn = [], diarizer.static.fn

    def spy(*inputs, fixed=False):
        seen.append(int((inputs[-1] == SLOTS).sum()))
        return fn(*inputs, fixed=fixed)

    diarizer.static.fn = spy
    return seen


def schedule(audios: list[np.ndarray], joins: list[int]):
    """Each step's rows (stream, slot, first, last, samples): stream s joins at step joins[s] (or once a
    slot is free) and is pushed a packet a step; at its last packet it leaves and its slot is free
    for the next step."""
    free, slot_of, at, done, k = list(range(SLOTS)), {}, [0] * len(audios), set(), 0
    while len(done) < len(audios):
        for s, join in enumerate(joins):
            if join <= k and s not in slot_of and free:
                slot_of[s] = free.pop(0)
        rows = [(s, slot, at[s] == 0, at[s] + PACKET >= len(audios[s]), audios[s][at[s] : at[s] + PACKET])
                for s, slot in slot_of.items() if s not in done]
        yield rows
        for s, slot, _, last, _ in rows:
            at[s] += PACKET
            if last:
                free.append(slot)
                done.add(s)
        k += 1


@torch.inference_mode()  # as the engine's stages run
def run(diarizer: Diarizer, steps, after_step=lambda: None) -> dict[int, np.ndarray]:
    """Each stream's probabilities, read from its track at its last step (no result takes them)."""
    out = {}
    for rows in steps:
        items = [SimpleNamespace(slot=slot, first=first, last=last, seq=s) for s, slot, first, last, _ in rows]
        diarizer.run(SimpleNamespace(diarized=[(item, r[4]) for item, r in zip(items, rows)], results=[]))
        for item in items:
            if item.last:
                out[item.seq] = np.concatenate(diarizer.tracks[item.slot].probs)
        after_step()
    return out


def test_static_rounds_give_the_eager_probabilities_and_slot_state(sortformer, wavs):
    """Six streams of different lengths on four slots, joining and leaving between steps (slots taken
    again): the same probabilities per frame and stream, and after each step the same state in every
    real slot, with padding rows replayed on a NaN scratch slot."""
    eager, static = diarizers(sortformer)
    padded = padded_rounds(static)
    audios = varied_audios(wavs, 6)
    joins = [0, 0, 2, 3, 5, 9]
    states = []
    want = run(eager, schedule(audios, joins), lambda: states.append(copy.deepcopy(eager.state)))
    got = run(static, schedule(audios, joins), lambda: states.append(copy.deepcopy(static.state)))
    assert sorted(got) == sorted(want) == list(range(len(audios)))
    for s in want:
        assert got[s].shape == want[s].shape and got[s].shape[0] > 20, s
        assert np.abs(got[s] - want[s]).max() < ATOL, s
        assert np.array_equal(got[s] > 0.5, want[s] > 0.5), s
    half = len(states) // 2
    assert half * 2 == len(states)
    for k, (a, b) in enumerate(zip(states[:half], states[half:])):
        assert same_state(a, b, slice(0, SLOTS)), k
    assert bool(eager.state.compressed.any())  # the caches overflowed: compression ran in the graphs' path
    assert any(padded) and static.static.replays == len(padded) and static.static.eager_calls == 0


@torch.inference_mode()
def test_padding_rows_never_change_a_real_slot(sortformer):
    """Three streams run at size 4: the padding row steps the NaN scratch slot only; the slot left out
    keeps its state bit for bit, the three get what the eager step gives them."""
    eager, static = diarizers(sortformer)
    gen = torch.Generator().manual_seed(0)
    for state in (eager.state, static.state):  # the same random state in every real slot
        for f in dataclasses.fields(state):
            t = getattr(state, f.name)
            if t.dtype == torch.float32:
                t[:SLOTS] = torch.rand(t[:SLOTS].shape, generator=torch.Generator().manual_seed(1))
        state.spkcache_lengths[:SLOTS] = torch.tensor([20, 3, 11, 20])
        state.fifo_lengths[:SLOTS] = torch.tensor([8, 0, 5, 7])
        state.n_sil_frames[:SLOTS] = torch.tensor([4, 0, 2, 9])
    before = copy.deepcopy(static.state)
    padded = padded_rounds(static)
    feats = torch.randn(3, static.width, sortformer.cfg.features.n_mels, generator=gen)
    args = (torch.tensor([56, 40, 23]), torch.tensor([8, 0, 8]), torch.tensor([16, 0, 0]), torch.tensor([2, 0, 3]))
    got = static.static(feats, *args)
    want = eager.step_rows(feats, *args)
    assert padded == [1]  # one replay at size 4, its last row the scratch slot's
    valid = static.sortformer.own_frames(*args[:3])
    for row, n in enumerate(valid.tolist()):
        assert n > 0 and torch.allclose(got[row, :n], want[row, :n], atol=ATOL), row
    assert same_state(static.state, eager.state, slice(0, SLOTS))
    assert all(torch.equal(getattr(static.state, f.name)[1], getattr(before, f.name)[1])
               for f in dataclasses.fields(before))  # slot 1: not in the batch
    assert not any(getattr(static.state, f.name)[:SLOTS].isnan().any() for f in dataclasses.fields(before)
                   if getattr(before, f.name).dtype == torch.float32)


def test_engine_through_static_batches_gives_the_same_speakers(sortformer, wavs):
    """The demo recogniser and the diarizer, both through static batches: each stream's speaker
    probabilities are the eager engine's (three streams, sizes 1, 2 and 4: a padding row)."""
    audios = varied_audios(wavs, 3)

    def speakers(**options) -> list[np.ndarray]:
        with ASREngine("demo", max_num_streams=4, diarizer=sortformer, **options) as engine:
            out = diarized_speakers(engine, audios)
            if options:
                static = engine.diarizer.static
                assert static.replays > 0 and static.eager_calls == 0 and static.sizes == [1, 2, 4]
        return out

    want, got = speakers(), speakers(cuda_graphs=True, max_batch=4)
    for a, b in zip(got, want):
        assert a.shape == b.shape and len(a) > 20 and np.abs(a - b).max() < ATOL

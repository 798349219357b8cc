"""The pre-encode stage's framing: log-mel features of new samples, cut into NeMo's streaming
chunks. FrontEnd is a stream's state between steps (host integers); FrontEnds keeps every
slot's mel frames on the model's device.

Chunks are cut exactly as NeMo's CacheAwareStreamingAudioBuffer cuts them, at the frame counts
of ChunkSpec.frames_through; every window has the same size so that chunks of different
streams (first chunks included) batch together.

A stream's timeline is its last `pre_cache` frames already cut (the pre-encode cache, zeros at
the start), then its frames not cut yet. Between steps its timeline stays on the device, in its
slot's rows of `FrontEnds.carry`, and its counts in the slot's row of FrontEnds' columns (rows
carried, chunks cut, fresh), so a step reads and writes them by slot, not stream by stream. A
step computes every stream's new frames at once, lays the step's carried rows and new rows out in
one tensor, and cuts every window of a lookahead mode with one gather whose index the host
computes as arrays; the rest of each timeline goes back into the carry with one more gather. The
features never come back to the host.

Why no tensor per stream: every torch call hands the GIL back and takes it again, and while
another thread runs Python (the server's protocol work, the other stages) taking it back waits
up to the interpreter's switch interval. A step of 256 streams with a torch call per stream took
4 ms per chunk beside one busy Python thread, against 0.1 ms alone; what is left per stream
here is framing arithmetic on small numpy arrays and integers, which keeps the GIL.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..model.conformer import ChunkSpec
from ..model.device import to_device
from ..model.features import FeatureStream, LogMelFeatures
from ..model.parakeet import ParakeetModel


class FrontEnd:
    """One stream's STFT framing, written by the pre-encode stage only (its counts are its slot's
    row of FrontEnds' columns)."""

    def __init__(self, features: LogMelFeatures, spec: ChunkSpec):
        self.spec = spec
        self.framing = FeatureStream(features)


class Cut(NamedTuple):
    """One chunk to cut: window row j is timeline row shift + j for lo <= j < hi, a zero row
    elsewhere; `new`: its new frames (the timeline moves on by them)."""

    shift: int
    lo: int
    hi: int
    new: int


class Windows(NamedTuple):
    """The chunks of one lookahead mode in a step, round by round (each stream's first chunk, then
    each one's second, ...): row i of `frames` is the chunk of round `round[i]` of the stream at
    `owner[i]` in the step's front ends, its mel frames valid in [start[i], start[i] + length[i])."""

    frames: torch.Tensor  # [chunks, spec.window, n_mels] on the device
    owner: np.ndarray
    round: np.ndarray
    start: np.ndarray
    length: np.ndarray


class StepRows(NamedTuple):
    """One step's mel rows on the device, [pre_cache zero rows, the carried rows of each stream that
    has any, every new row], and where each stream's timeline is in them."""

    rows: torch.Tensor
    slots: np.ndarray  # each stream's
    taken: np.ndarray  # timeline rows the step's chunks took (cut adds them, keep reads them)
    carried: np.ndarray  # timeline rows that come from the carry (the first ones)
    carry_at: np.ndarray  # where those are (a fresh stream's: the zero rows)
    new_at: np.ndarray  # where its new rows are
    length: np.ndarray  # its timeline's rows

    def index(self, owner: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Where timeline row `rows[i, j]` of stream `owner[i]` is in `rows`."""
        carried = self.carried[owner][:, None]
        return np.where(rows < carried, self.carry_at[owner][:, None] + rows, self.new_at[owner][:, None] + rows - carried)


class FrontEnds:
    """The mel frames of every slot's timeline between steps, [slots, rows, n_mels] float32 on the
    features' device (its rows grow to the longest timeline kept: the pre-encode cache and the few
    frames a chunk's samples give beyond it), and the step's framing and cutting."""

    def __init__(self, features: LogMelFeatures, slots: int):
        self.features = features
        self.carry = torch.zeros(slots, 0, features.cfg.n_mels, device=features.fb.device)
        self.fresh = np.ones(slots, bool)  # nothing of its stream in the slot yet: its pre-encode cache is zeros
        self.carried = np.zeros(slots, np.int64)  # timeline rows: the pre-encode cache, then frames not cut yet
        self.chunks_cut = np.zeros(slots, np.int64)

    def start(self, slots: list[int]) -> None:
        """New streams in `slots` (their first step): nothing of theirs is there yet."""
        self.fresh[slots], self.chunks_cut[slots] = True, 0

    @staticmethod
    def slot_bytes(model: ParakeetModel) -> int:
        """A slot's rows at most: the pre-encode cache and a chunk of the widest mode (in practice
        the cache and a frame or two: a step frames only as far as its chunks reach)."""
        encoder = model.encoder
        rows = max(encoder.chunk_spec(mode).window for mode in model.cfg.encoder.att_context_sizes)
        return rows * model.cfg.features.n_mels * 4

    def new_frames(self, fronts: list[FrontEnd], samples: list[np.ndarray], last: list[bool]) -> tuple[torch.Tensor, np.ndarray]:
        """Frame every stream's new samples (all that is left of them where `last`) and compute all
        their log-mel frames in one batch: (frames [F, n_mels] float32 on the device, stream by
        stream, each stream's count). NeMo zero-masks a stream's frames past samples // hop."""
        segments, counts, masked, total = [], [], [], 0
        for front, new, is_last in zip(fronts, samples, last):
            segment = front.framing.push(np.asarray(new, np.float32))
            segments.append(segment)
            count = segment[1]
            if is_last:
                segments.append(end := front.framing.flush())
                count += end[1]
                done = front.framing.frames_done - count  # its frames of earlier steps
                masked.append((total, max(0, front.framing.valid_frames - done), count))
            counts.append(count)
            total += count
        features = self.features
        if not total:
            return torch.zeros(0, features.cfg.n_mels, device=features.fb.device), np.zeros(len(fronts), np.int64)
        mel = features.mel(features.frames(segments)).float()
        zero = [np.arange(at + valid, at + count) for at, valid, count in masked if valid < count]
        if zero:
            mel.index_fill_(0, to_device(np.concatenate(zero), mel.device), 0.0)
        return mel, np.array(counts, np.int64)

    def lay_out(self, fronts: list[FrontEnd], slots: list[int], mel: torch.Tensor, counts: np.ndarray) -> StepRows:
        """The step's rows: its streams' carried timelines (from their slots) and their new frames."""
        pre, at = fronts[0].spec.pre_cache, np.asarray(slots, np.int64)
        held = ~self.fresh[at]
        carried = np.where(held, self.carried[at], pre)
        rows_each = self.carry.size(1)
        carry_at = np.zeros(len(fronts), np.int64)
        carry_at[held] = pre + rows_each * np.arange(int(held.sum()))
        parts = [mel.new_zeros(pre, mel.size(1))]
        if held.any():
            parts.append(self.carry.index_select(0, to_device(at[held], mel.device)).flatten(0, 1))
        new_at = pre + rows_each * int(held.sum()) + np.cumsum(counts) - counts
        return StepRows(torch.cat((*parts, mel)), at, np.zeros(len(fronts), np.int64), carried, carry_at, new_at,
                        carried + counts)

    def cut(self, fronts: list[FrontEnd], step: StepRows, members: list[int], chunks: list[int],
            last: list[bool]) -> Windows | None:
        """The next chunks of the streams `members` (of one lookahead mode; `chunks`, `last`: theirs)
        as one tensor (None without any), each one's front moved on by them (`keep` then stores the
        rest of its timeline)."""
        spec, at = fronts[members[0]].spec, np.asarray(members, np.int64)
        cut_before = self.chunks_cut[step.slots[at]]
        planned = [(m, r, *cut) for m, before, count, is_last in zip(members, cut_before.tolist(), chunks, last)
                   if is_last or not before  # first chunks, ends: one by one
                   for r, cut in enumerate(_plan(spec, before, int(step.length[m]), count, is_last))]
        steady = _steady_cuts(spec, step, at, cut_before > 0, chunks, last)
        cuts = np.concatenate((steady, np.array(planned, np.int64).reshape(-1, 6)))
        if not cuts.size:
            return None
        owner, rounds, shift, lo, hi, new = cuts[np.lexsort((cuts[:, 0], cuts[:, 1]))].T  # round by round, in the step's order
        j = np.arange(spec.window)
        index = np.where((j >= lo[:, None]) & (j < hi[:, None]), step.index(owner, shift[:, None] + j), 0)
        self.chunks_cut[step.slots[at]] += np.bincount(owner, minlength=len(fronts))[at]
        step.taken[at] += np.bincount(owner, new, minlength=len(fronts)).astype(np.int64)[at]
        frames = step.rows.index_select(0, to_device(index.ravel(), step.rows.device))
        return Windows(frames.view(len(owner), j.size, -1), owner, rounds, lo, hi - lo)

    def keep(self, fronts: list[FrontEnd], slots: list[int], step: StepRows) -> None:
        """Store the rest of every stream's timeline (after the frames its chunks took) in its slot."""
        taken = step.taken
        rest = step.length - taken
        longest = int(rest.max(initial=0))
        if longest > self.carry.size(1):
            grown = self.carry.new_zeros(self.carry.size(0), longest, self.carry.size(2))
            grown[:, : self.carry.size(1)] = self.carry
            self.carry = grown
        i = np.arange(longest)
        index = np.where(i < rest[:, None], step.index(np.arange(len(fronts)), taken[:, None] + i), 0)
        rows = step.rows.index_select(0, to_device(index.ravel(), step.rows.device))
        self.carry[to_device(step.slots, step.rows.device), :longest] = rows.view(len(fronts), longest, -1)
        self.carried[step.slots], self.fresh[step.slots] = rest, False


def _steady_cuts(spec: ChunkSpec, step: StepRows, at: np.ndarray, started: np.ndarray, chunks: list[int],
                 last: list[bool]) -> np.ndarray:
    """The cuts of the streams `at` (in the step) past their first chunk (`started`) and not at their
    end (almost every one), as arrays: each takes its whole chunks, up to its count; chunk r's window
    is the `pre_cache` frames before it, then its own. [cuts, 6]: owner, round, then Cut's fields."""
    steady = ~np.asarray(last, bool) & started
    n = np.minimum(np.asarray(chunks, np.int64), (step.length[at] - spec.pre_cache) // spec.chunk_frames)
    n = np.where(steady, np.maximum(n, 0), 0)
    owner = np.repeat(at, n)
    rounds = np.arange(owner.size) - np.repeat(np.cumsum(n) - n, n)
    fixed = np.broadcast_to(np.array([0, spec.window, spec.chunk_frames]), (owner.size, 3))
    return np.column_stack((owner, rounds, rounds * spec.chunk_frames, fixed))


def _plan(spec: ChunkSpec, cut_before: int, length: int, count: int, last: bool) -> list[Cut]:
    """The chunks to cut from a timeline of `length` rows, `cut_before` chunks cut before: the next
    `count`; in its last step, every chunk left, the partial last one too."""
    out: list[Cut] = []
    offset = 0
    pre = spec.pre_cache
    have = length - pre  # frames not cut yet
    while last or len(out) < count:
        chunk = cut_before + len(out)
        size = spec.size(chunk)
        # NeMo's streaming buffer counts every frame it holds as valid (the zero-masked tail too)
        if have - offset < size and not (last and have - offset >= spec.shortest_last(chunk)):
            break
        new = min(size, have - offset)
        if chunk == 0:  # left-padded to the window: its frames after `first_pad` zero rows
            out.append(Cut(pre - spec.first_pad, spec.first_pad, spec.first_pad + new, new))
        else:  # the previous `pre_cache` frames of the timeline, then its own
            out.append(Cut(offset, 0, pre + new, new))
        offset += new
    return out

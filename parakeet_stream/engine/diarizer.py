"""The diarize stage: Streaming Sortformer over the streams that asked for speakers, batched.

Each slot has a row of one SortformerState pool (model/sortformer_streaming.py) and a Track on the
host: the diarizer's own log-mel framing of the stream's samples (its mel bands may differ from the
recogniser's), the mel frames not consumed yet, where its next chunk starts. The pre-encode stage
hands on each diarized stream's new samples (`Step.diarized`); this stage, after the step's results
are built, frames them and runs every diarizer chunk that has its right context (at a stream's last
step: every chunk left, the partial last one too), one round of chunks of all such streams at once.

With static batches (the engine's CUDA graphs, runner/cuda_graphs.py) a round's model work replays a
graph captured at start-up on the decode stage's stream (this stage runs on its thread): the slots'
state gathered, the subsampling, encoder, Transformer and head over [speaker cache; FIFO; chunk]
at their widest, the FIFO and cache update, every row's cache compression (kept where it overflowed)
and the state scattered back; padding rows step a scratch slot past the real ones. The framing
into mel frames and the choice of each round's chunks stay on the host, eager.

A diarized stream's results are held until the diarizer has covered their words' audio, so each
word has its speaker probabilities when a door sees it and its speaker never changes; this delays
them by the diarizer's chunk and right context. A word's audio ends about TOKEN_LAG_FRAMES
recogniser frames before the result's `audio_seconds` (a token comes once its sound is heard), so
a result goes out once the diarizer covered its audio but that lag. The first result released after new
diarizer frames carries them (`StreamResult.speakers`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ..model.features import FeatureStream
from ..model.sortformer import Sortformer, StreamingConfig
from ..model.sortformer_streaming import SortformerState, StreamingSortformer
from .diarizer_model import live_streaming
from .results import StreamResult
from .runner.cuda_graphs import StaticBatches, graph_sizes, on_device
from .step import Step, StepItem

log = logging.getLogger(__name__)

# Recogniser frames between a word's audio and its tokens' times (the demo recogniser's first word
# of a turn starts about 3 frames after the voice does, its last word ends about 2 after it stops).
TOKEN_LAG_FRAMES = 2

@dataclass
class Track:
    """A slot's stream in the diarizer: written by the diarize stage only."""

    framing: FeatureStream
    mel: torch.Tensor  # [rows, n_mels]: its mel frames from `mel_at` on
    mel_at: int = 0
    start: int = 0  # the next chunk's first own mel frame
    ended: bool = False  # every frame of the stream is in `mel`
    probs: list[np.ndarray] = field(default_factory=list)  # probability frames no result carried yet
    frames: int = 0  # probability frames made
    held: list[StreamResult] = field(default_factory=list)  # results waiting for the diarizer

    @property
    def have(self) -> int:
        return self.mel_at + self.mel.size(0)


class Diarizer:
    def __init__(self, model: Sortformer, slots: int, streaming: StreamingConfig | None = None,
                 max_batch: int | None = None, graphs: bool = False, lane: dict | None = None, token_lag: float = 0.0):
        """graphs: a round's model work from static batches of up to `max_batch` rows (CUDA graphs on
        CUDA, their eager stand-in on CPU); lane: the decode stage's graph memory pool and stream (CUDA);
        token_lag: seconds from a word's audio to its tokens' times (the recogniser's TOKEN_LAG_FRAMES)."""
        self.token_lag = token_lag
        self.sortformer = StreamingSortformer(model, streaming or live_streaming(model))
        self.features = model.features
        self.device = model.features.fb.device
        self.state = self.sortformer.init_state(slots + (1 if graphs else 0), self.device)  # and a scratch slot
        self.tracks: list[Track | None] = [None] * slots
        c, f = self.sortformer.cfg, self.sortformer.factor
        self.chunk, self.left, self.right = c.chunk_len * f, c.chunk_left_context * f, c.chunk_right_context * f
        self.width = self.left + self.chunk + self.right  # a round's mel frames per row: the widest chunk
        self.frame_seconds = f * model.cfg.features.hop_length / model.cfg.features.sample_rate
        self.speakers = model.cfg.n_spk
        self.static = None
        if graphs:  # few streams ask for speakers: powers of two, as the recogniser's rarer batches
            self.static = StaticBatches("diarize", self.step_rows, self._inputs, (None, 0, 0, 0, slots), max_batch,
                                        self.device.type == "cuda", sizes=graph_sizes(max_batch, dense=max_batch),
                                        **(lane or {}))

    def capture(self) -> None:
        """Every graph, before the stage threads start (as ModelRunner.capture)."""
        if self.static is not None:
            with torch.inference_mode(), on_device(self.device):
                self.static.capture()
            if self.static.graphs:
                log.info("captured %d diarizer graphs in %.1f s", self.graph_count, self.static.capture_seconds)

    @property
    def graph_count(self) -> int:
        return len(self.static.sizes) if self.static is not None and self.static.graphs else 0

    def _inputs(self, n: int) -> tuple[torch.Tensor, ...]:
        counts = torch.zeros(n, dtype=torch.long, device=self.device)
        feats = self.state.fifo.new_zeros(n, self.width, self.features.cfg.n_mels)
        return feats, counts, counts.clone(), counts.clone(), counts.clone()

    def step_rows(self, feats, lengths, left, right, rows, fixed: bool = False) -> torch.Tensor:
        """One chunk of the streams at state rows `rows` (sortformer_streaming's `step`), their state
        stepped in the pool; their chunk's probabilities [B, frames, speakers]."""
        state = self.state.select(rows)
        probs, _ = self.sortformer.step(state, feats, lengths, left, right, fixed=fixed)
        self.state.put(rows, state)
        return probs

    @staticmethod
    def slot_bytes(model: Sortformer, streaming: StreamingConfig | None = None) -> int:
        """A slot's row of the state pool (its host Track is a few chunks of mel frames more)."""
        return SortformerState.zeros(model, streaming or live_streaming(model), 1).nbytes_per_row()

    @staticmethod
    @torch.inference_mode()
    def row_bytes(model: Sortformer, streaming: StreamingConfig | None = None, probe: int = 8) -> int:
        """Peak device bytes per row of a round at its widest (CUDA): its static inputs and what a graph
        of it holds in its memory pool for good, or an eager round for its time; measured on a probe batch."""
        diarizer = Diarizer(model, probe, streaming)
        device, rows = diarizer.device, torch.arange(probe, device=diarizer.device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        feats = diarizer._inputs(probe)[0]
        full = [torch.full_like(rows, n) for n in (diarizer.width, diarizer.left, diarizer.right)]
        diarizer.step_rows(feats, *full, rows, fixed=True)
        torch.cuda.synchronize(device)
        return -(-(torch.cuda.max_memory_allocated(device) - base) // probe)

    def run(self, step: Step) -> None:
        if not step.diarized:
            return
        items = [item for item, _ in step.diarized]
        self._start([item.slot for item in items if item.first])
        tracks = [self.tracks[item.slot] for item in items]
        self._frame(tracks, [samples for _, samples in step.diarized], [item.last for item in items])
        while self._round(tracks, [item.slot for item in items]):
            pass
        self._hold(step, items, tracks)

    def _start(self, slots: list[int]) -> None:
        if slots:
            self.state.reset(slots)
        for slot in slots:
            empty = torch.zeros(0, self.features.cfg.n_mels, device=self.features.fb.device)
            self.tracks[slot] = Track(FeatureStream(self.features), empty)

    def _frame(self, tracks: list[Track], samples: list[np.ndarray], last: list[bool]) -> None:
        """Every stream's new mel frames, computed at once; at its end only those NeMo counts as valid."""
        segments, counts = [], []
        for track, new, is_last in zip(tracks, samples, last):
            pieces = [track.framing.push(np.asarray(new, np.float32))]
            if is_last:
                pieces.append(track.framing.flush())
            segments += pieces
            counts.append(sum(count for _, count in pieces))
        if sum(counts):
            mel = self.features.mel(self.features.frames(segments)).float()
            for track, part in zip(tracks, mel.split(counts)):
                track.mel = torch.cat((track.mel, part))
        for track, is_last in zip(tracks, last):
            if is_last:
                track.mel = track.mel[: max(0, track.framing.valid_frames - track.mel_at)]
                track.ended = True

    def _next_chunk(self, track: Track) -> tuple[int, int, int, int] | None:
        """(first, end) mel frames of its next chunk, context included, and its left / right context;
        None until it has its right context (or the stream ended and none is left)."""
        start, have = track.start, track.have
        if track.ended:
            if start >= have:
                return None
            end = min(start + self.chunk, have)
            right = min(self.right, have - end)
        elif have >= start + self.chunk + self.right:
            end, right = start + self.chunk, self.right
        else:
            return None
        left = min(self.left, start)
        return start - left, end + right, left, right

    def _round(self, tracks: list[Track], slots: list[int]) -> bool:
        """One chunk of every stream that has one ready, stepped at once; False: none had one."""
        ready = [(k, chunk) for k, track in enumerate(tracks) if (chunk := self._next_chunk(track)) is not None]
        if not ready:
            return False
        feats = self.state.fifo.new_zeros(len(ready), self.width, self.features.cfg.n_mels)
        for row, (k, (first, end, _, right)) in enumerate(ready):
            track = tracks[k]
            feats[row, : end - first] = track.mel[first - track.mel_at : end - track.mel_at]
            track.start = end - right
            keep_from = max(0, track.start - self.left)  # the next chunk's left context on
            track.mel, track.mel_at = track.mel[keep_from - track.mel_at :], keep_from
        lengths = torch.tensor([end - first for _, (first, end, _, _) in ready])
        left = torch.tensor([chunk[2] for _, chunk in ready])
        right = torch.tensor([chunk[3] for _, chunk in ready])
        rows = torch.tensor([slots[k] for k, _ in ready])
        valid = self.sortformer.own_frames(lengths, left, right).tolist()  # a static batch returns the probabilities only
        run = self.static or self.step_rows
        probs = run(feats, *(t.to(self.device) for t in (lengths, left, right, rows))).float().cpu().numpy()
        for row, (k, _) in enumerate(ready):
            tracks[k].probs.append(probs[row, : valid[row]])
            tracks[k].frames += valid[row]
        return True

    def _hold(self, step: Step, items: list[StepItem], tracks: list[Track]) -> None:
        """The step's results of diarized streams wait in their tracks; those the diarizer covered go out."""
        by_seq = {item.seq: track for item, track in zip(items, tracks)}
        kept = []
        for seq, result in step.results:
            track = by_seq.get(seq)
            if track is None:
                kept.append((seq, result))
            else:
                track.held.append(result)
        for item, track in zip(items, tracks):
            kept += [(item.seq, result) for result in self._release(track, item.last)]
        step.results = kept

    def _release(self, track: Track, everything: bool) -> list[StreamResult]:
        covered = track.frames * self.frame_seconds + self.token_lag + 1e-9
        n = len(track.held) if everything else next(
            (i for i, r in enumerate(track.held) if r.audio_seconds > covered), len(track.held))
        out, track.held = track.held[:n], track.held[n:]
        if out and track.probs:
            out[0].speakers = np.concatenate(track.probs)
            track.probs = []
        return out

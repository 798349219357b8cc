"""One stream's state: arriving samples, framing, chunking, and the results it produced."""

from __future__ import annotations

import enum
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..conformer import ChunkSpec
from ..features import FeatureStream, LogMelFeatures
from ..tokenizer import IncrementalDetokenizer

MAX_PENDING_RESULTS = 32  # beyond this, new results merge into the newest one (nothing is dropped)


class Status(enum.Enum):
    WAITING = "waiting"
    ACTIVE = "active"
    DONE = "done"


@dataclass
class StreamResult:
    stream_id: int
    token_ids: list[int]
    text: str
    is_final: bool
    utterance_end: bool = False
    start: float | None = None
    end: float | None = None
    token_times: list[float] = field(default_factory=list)  # stream seconds of each new token's frame
    audio_seconds: float = 0.0
    latency: float | None = None
    error: str | None = None

    def merge(self, later: "StreamResult") -> None:
        """Fold a later result into this one (used when a client falls behind)."""
        self.token_ids += later.token_ids
        self.text += later.text
        self.token_times += later.token_times
        self.is_final |= later.is_final
        self.utterance_end |= later.utterance_end
        self.start = self.start if self.start is not None else later.start
        self.end = later.end if later.end is not None else self.end
        self.audio_seconds = later.audio_seconds
        self.latency = later.latency
        self.error = self.error or later.error


@dataclass
class Chunk:
    """Mel frames of one encoder step for one stream, on their way through the pipeline."""

    seq: "Sequence"
    window: torch.Tensor | None  # [spec.window, n_mels]; None for an end-of-stream marker
    start: int
    length: int
    ready_at: float
    last: bool = False
    x: torch.Tensor | None = None  # pre-encoded frames [T, D]
    x_len: int = 0
    encoded: torch.Tensor | None = None  # encoder output [T, D]


@dataclass
class Sequence:
    stream_id: int
    lookahead: tuple[int, int]
    spec: ChunkSpec
    frames: FeatureStream
    detok: IncrementalDetokenizer
    n_mels: int
    status: Status = Status.WAITING
    slot: int | None = None
    final_requested: bool = False
    finished_input: bool = False  # the end-of-stream marker has been queued
    cancelled: bool = False
    failed: bool = False
    in_flight: int = 0
    chunks_made: int = 0
    frames_decoded: int = 0  # encoder frames decoded so far (token timing)
    last_token_frame: int = -1
    utterance_has_tokens: bool = False
    token_ids: list[int] = field(default_factory=list)
    created_at: float = field(default_factory=time.monotonic)
    _samples: list[np.ndarray] = field(default_factory=list)
    _arrivals: deque = field(default_factory=deque)  # (total samples after a push, arrival time)
    _samples_in: int = 0
    _mel: torch.Tensor | None = None  # features not yet cut into chunks
    _history: torch.Tensor | None = None  # last `pre_cache` frames: the pre-encode cache
    _ending: bool = False  # every feature frame of the stream has arrived
    results: deque = field(default_factory=deque)
    listeners: list[Callable[[], None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- called by client threads -------------------------------------------------
    def add_samples(self, samples: np.ndarray) -> None:
        with self.lock:
            self._samples.append(samples)
            self._samples_in += samples.size
            self._arrivals.append((self._samples_in, time.monotonic()))

    def take_results(self) -> list[StreamResult]:
        with self.lock:
            out = list(self.results)
            self.results.clear()
            return out

    # --- called by the pre-encode thread -------------------------------------------
    def drain_samples(self) -> torch.Tensor:
        with self.lock:
            parts, self._samples = self._samples, []
        if not parts:
            return torch.zeros(0)
        return torch.from_numpy(np.concatenate(parts).astype(np.float32, copy=False))

    def ready_time(self, samples_needed: int) -> float:
        """When the sample a chunk needed last arrived (chunk latency starts there)."""
        with self.lock:
            while len(self._arrivals) > 1 and self._arrivals[0][0] < samples_needed:
                self._arrivals.popleft()
            return self._arrivals[0][1] if self._arrivals else time.monotonic()

    def add_features(self, mel: torch.Tensor, ending: bool = False) -> None:
        if self._mel is None:
            self._mel = mel.new_zeros(0, self.n_mels)
            self._history = mel.new_zeros(self.spec.pre_cache, self.n_mels)
        self._mel = torch.cat((self._mel, mel))
        self._ending |= ending

    def cut_chunks(self, hop: int, n_fft: int) -> list[Chunk]:
        """Every chunk the buffered features complete; at the end of stream the partial last one too."""
        chunks: list[Chunk] = []
        while self._mel is not None:
            chunk = self._next_chunk(hop, n_fft)
            if chunk is None:
                break
            chunks.append(chunk)
        return chunks

    def _next_chunk(self, hop: int, n_fft: int) -> Chunk | None:
        spec, first = self.spec, self.chunks_made == 0
        size = spec.first_frames if first else spec.chunk_frames
        have = self._mel.size(0)
        # NeMo's streaming buffer counts every frame it holds as valid (the zero-masked tail
        # too) and drops a last piece shorter than one subsampling step.
        if have < size and not (self._ending and have >= (1 if first else spec.factor)):
            return None
        new = self._mel[:size]
        start_frame = self._frames_cut()
        pad = new.new_zeros(spec.window, self.n_mels)
        if first:
            pad[spec.first_pad : spec.first_pad + new.size(0)] = new
            start, length = spec.first_pad, new.size(0)
        else:
            pad[: spec.pre_cache] = self._history
            pad[spec.pre_cache : spec.pre_cache + new.size(0)] = new
            start, length = 0, spec.pre_cache + new.size(0)
        self._history = torch.cat((self._history, new))[-spec.pre_cache :]
        self._mel = self._mel[size:]
        self.chunks_made += 1
        needed = (start_frame + new.size(0) - 1) * hop + n_fft // 2
        return Chunk(self, pad, start, length, self.ready_time(needed))

    def _frames_cut(self) -> int:
        spec = self.spec
        return 0 if self.chunks_made == 0 else spec.first_frames + spec.chunk_frames * (self.chunks_made - 1)

    # --- results ---------------------------------------------------------------------
    def publish(self, result: StreamResult) -> None:
        with self.lock:
            if len(self.results) >= MAX_PENDING_RESULTS:
                self.results[-1].merge(result)
            else:
                self.results.append(result)
            listeners = list(self.listeners)
        for notify in listeners:
            notify()

    def notify(self) -> None:
        with self.lock:
            listeners = list(self.listeners)
        for fn in listeners:
            fn()


def feature_batch(features: LogMelFeatures, seqs: list[Sequence], final: set[int]) -> list[torch.Tensor]:
    """Frame every sequence's new samples and compute all their log-mel frames in one batch."""
    raw = []
    for seq in seqs:
        frames = seq.frames.push(seq.drain_samples())
        if seq.stream_id in final:
            frames = torch.cat((frames, seq.frames.flush()))
        raw.append(frames)
    sizes = [r.size(0) for r in raw]
    fb = features.fb
    mel = features.mel(torch.cat(raw).to(fb.device, fb.dtype)) if sum(sizes) else fb.new_zeros(0, fb.size(0))
    out = list(mel.split(sizes))
    for seq, m in zip(seqs, out):
        ending = seq.stream_id in final
        if ending:  # NeMo zero-masks the frames past samples // hop
            done = seq.frames.frames_done - m.size(0)
            m[max(0, seq.frames.valid_frames - done) :] = 0.0
        seq.add_features(m, ending)
    return out

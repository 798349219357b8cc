"""What a stream gets back: results, how they are built from new tokens, and the outbox that
holds them until the client takes them."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..model.tokenizer import IncrementalDetokenizer, Tokenizer
from .languages import AUTO

MAX_PENDING_RESULTS = 32  # beyond this, new results merge into the newest one (nothing is dropped)


@dataclass
class StreamResult:
    stream_id: int
    token_ids: list[int]
    text: str
    is_final: bool  # the stream's last result: it answers the client's final (or says why there is none)
    utterance_end: bool = False
    start: float | None = None
    end: float | None = None
    token_times: list[float] = field(default_factory=list)  # stream seconds of each new token's frame
    token_confidences: list[float] = field(default_factory=list)  # each new token's probability, in (0, 1]
    audio_seconds: float = 0.0
    latency: float | None = None
    error: str | None = None
    # how sure the model is, at `audio_seconds`, that the utterance is over (in [0, 1]): with <EOU>,
    # the highest probability it gave <EOU> since its last other token in this result (ResultBuilder);
    # without, the blank frames after the last token as a share of the endpoint silence
    end_of_utterance: float = 0.0
    # a multilingual model's language: the stream's, or with "auto" the last one the model wrote
    # (None until it wrote one; always None for a model without language prompts)
    language: str | None = None
    # a diarized stream's speaker probabilities [frames, speakers] of the diarizer's next frames (one
    # per `EngineInfo.speaker_frame_seconds`, from the stream's start), or None (diarizer.py)
    speakers: np.ndarray | None = None

    def merge(self, later: "StreamResult") -> None:
        """Fold a later result into this one (used when a client falls behind)."""
        self.token_ids += later.token_ids
        self.text += later.text
        self.token_times += later.token_times
        self.token_confidences += later.token_confidences
        self.is_final |= later.is_final
        self.utterance_end |= later.utterance_end
        self.start = self.start if self.start is not None else later.start
        self.end = later.end if later.end is not None else self.end
        self.audio_seconds = later.audio_seconds
        self.latency = later.latency
        self.error = self.error or later.error
        spoken = later.text.strip()  # its figure counts from its own last word
        self.end_of_utterance = later.end_of_utterance if spoken else max(self.end_of_utterance, later.end_of_utterance)
        self.language = later.language or self.language
        if later.speakers is not None:
            self.speakers = later.speakers if self.speakers is None else np.concatenate((self.speakers, later.speakers))


class DecoderProgress:
    """One stream's decoding so far, written by the decode stage only (through ResultBuilder):
    encoder frames decoded, the frame of the last token, whether the open utterance has tokens,
    the incremental detokenizer, and the language results report."""

    def __init__(self, tokenizer: Tokenizer, language: str | None = None):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.detects = language == AUTO  # the language is the last tag the model wrote
        self.language = None if self.detects else language
        self.frames_decoded = 0
        self.last_token_frame = -1
        self.utterance_has_tokens = False


class ResultBuilder:
    """Turns one chunk's new tokens of a stream into its result: text, timing, end of utterance.

    Models with `<EOU>` end an utterance with it; others end one after `endpoint_frames` blank
    frames following a token.
    """

    def __init__(self, frame_seconds: float, eou_id: int | None, endpoint_frames: int,
                 language_tags: dict[int, str] | None = None):
        self.fs = frame_seconds
        self.eou_id = eou_id
        self.endpoint_frames = endpoint_frames
        self.language_tags = language_tags or {}  # a multilingual model's tag ids -> languages

    def build(self, stream_id: int, progress: DecoderProgress, tokens: list[tuple[int, int]], frames: int,
              final: bool, latency: float | None, eou: float = 0.0) -> StreamResult:
        """tokens: (id, frame within the chunk, probability); frames: encoder frames of the chunk;
        final: the stream's last result; eou: the greedy pass's <EOU> probability since the chunk's
        last other token (models with <EOU>)."""
        if not tokens and not final:
            return self._nothing_new(stream_id, progress, frames, latency, eou)
        ids = [tok for tok, _, _ in tokens]
        at = [progress.frames_decoded + t for _, t, _ in tokens]
        progress.frames_decoded += frames
        text = progress.detok.push(ids) + (progress.detok.flush() if final else "")
        ended = self._utterance_end(progress, ids, at)
        if progress.detects:
            progress.language = next((self.language_tags[i] for i in reversed(ids) if i in self.language_tags),
                                     progress.language)
        return StreamResult(
            stream_id=stream_id,
            token_ids=ids,
            text=text,
            is_final=final,
            utterance_end=ended,
            start=at[0] * self.fs if at else None,
            end=at[-1] * self.fs if at else None,
            token_times=[f * self.fs for f in at],
            token_confidences=[p for _, _, p in tokens],
            audio_seconds=progress.frames_decoded * self.fs,
            latency=latency,
            end_of_utterance=self._end_share(progress, ended, eou),
            language=progress.language,
        )

    def _nothing_new(self, stream_id: int, progress: DecoderProgress, frames: int, latency: float | None,
                     eou: float) -> StreamResult:
        """build() of a chunk without tokens (most of them): how far decoding got, how sure the model is
        that the utterance is over, and whether blank frames just ended it (models without <EOU>)."""
        progress.frames_decoded += frames
        ended = self.eou_id is None and self._utterance_end(progress, (), ())
        return StreamResult(stream_id, [], "", False, ended, audio_seconds=progress.frames_decoded * self.fs,
                            latency=latency, language=progress.language,
                            end_of_utterance=self._end_share(progress, ended, eou))

    def _end_share(self, progress: DecoderProgress, ended: bool, eou: float) -> float:
        """How sure the model is that the utterance is over: with <EOU>, the greedy pass's figure;
        without, the blank frames after the open utterance's last token as a share of the endpoint
        silence (1.0 where it ends; 0 with no token since the last end)."""
        if self.eou_id is not None:
            return eou
        if ended:
            return 1.0
        if not progress.utterance_has_tokens:
            return 0.0
        return min(1.0, (progress.frames_decoded - 1 - progress.last_token_frame) / max(1, self.endpoint_frames))

    def _utterance_end(self, progress: DecoderProgress, ids: list[int], frames: list[int]) -> bool:
        if frames:
            progress.last_token_frame = frames[-1]
            progress.utterance_has_tokens = True
        if self.eou_id is not None:
            ended = self.eou_id in ids
            if ended:
                progress.utterance_has_tokens = ids[-1] != self.eou_id
            return ended
        if progress.utterance_has_tokens and progress.frames_decoded - 1 - progress.last_token_frame >= self.endpoint_frames:
            progress.utterance_has_tokens = False
            return True
        return False


class Outbox:
    """Results waiting for the client, under its own lock: the engine publishes them (from the
    stage threads), client threads take them and listen for news."""

    def __init__(self) -> None:
        self._results: deque[StreamResult] = deque()
        self._since: float | None = None  # when the oldest result waiting was published
        self._listeners: tuple[Callable[[], None], ...] = ()  # replaced, never changed: read without the lock
        self._lock = threading.Lock()

    def publish(self, result: StreamResult, notify: bool = True) -> None:
        """Queue a result for the client; `notify`: call the listeners now (a step's results are all
        queued first, then their listeners called, so a woken client finds its step's results there)."""
        with self._lock:
            if len(self._results) >= MAX_PENDING_RESULTS:
                self._results[-1].merge(result)
            else:
                self._results.append(result)
            if self._since is None:
                self._since = time.monotonic()
        if notify:
            self.notify()

    def take(self) -> tuple[list[StreamResult], float | None]:
        """The results waiting, and how long the oldest of them waited (None: there was none)."""
        with self._lock:
            out = list(self._results)
            self._results.clear()
            waited = None if self._since is None else time.monotonic() - self._since
            self._since = None
            return out, waited

    def listen(self, callback: Callable[[], None], unless_waiting: bool = False) -> bool:
        """Call `callback` on every result and queue change; with `unless_waiting`, only if no
        result is waiting (False, and no listener added, when one is)."""
        with self._lock:
            if unless_waiting and self._results:
                return False
            self._listeners += (callback,)
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a result waits or news came (True), or `timeout` passed."""
        event = threading.Event()
        if not self.listen(event.set, unless_waiting=True):
            return True
        try:
            return event.wait(timeout)
        finally:
            self.unlisten(event.set)

    def unlisten(self, callback: Callable[[], None]) -> None:
        with self._lock:
            listeners = list(self._listeners)
            listeners.remove(callback)
            self._listeners = tuple(listeners)

    def notify(self) -> None:
        for fn in self._listeners:
            fn()

"""One engine stream as a connection sees it: input accounting, resampling, results (text,
and words with times: shared by every protocol).

Audio a client sends is resampled at once and appended to one contiguous buffer
(`pending`); it reaches the engine in pieces of at least MIN_PUSH_SECONDS, or all of it
on admission and at the end of the stream. A queued stream therefore holds its audio
here, in one bytearray, never one object per message.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np
import trio

from ..audio import StreamResampler
from ..engine import EngineError, QueueFull
from .codes import ProtocolError

if TYPE_CHECKING:
    from ..engine import ASREngine, StreamResult

MIN_PUSH_SECONDS = 0.01
SAMPLE_BYTES = 4  # float32
WORD_START = "\u2581"  # sentencepiece's word-boundary mark

TimedToken = tuple[int, float]  # (token id, stream seconds of its frame)


class Wakeup:
    """An edge-triggered wake-up that engine threads can fire into a trio task."""

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def set_threadsafe(self) -> None:
        """For engine listeners: cheap, never blocks, safe after trio has exited."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self.set)

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


class EngineStream:
    def __init__(
        self,
        engine: ASREngine,
        wakeup: Wakeup,
        lookahead: tuple[int, int] | None,
        input_rate: int,
        max_seconds: float | None,
    ) -> None:
        self.engine = engine
        self.sid = _create(engine, lookahead)
        self.lookahead = tuple(lookahead or engine.default_lookahead)
        self.input_rate = input_rate
        self._resampler = StreamResampler(input_rate)
        self._max_samples = None if max_seconds is None else int(max_seconds * engine.sample_rate)
        self._pending = bytearray()  # float32 samples at the model rate, not yet pushed
        self._min_push = int(MIN_PUSH_SECONDS * engine.sample_rate)
        self.pushed_samples = 0
        self.consumed_seconds = 0.0
        self.limit_reached = False  # cut at max_seconds and finalized
        self.text = ""  # the transcript so far
        self.token_count = 0
        self.words: list[dict] = []  # words completed by the last absorbed result
        self._open_word: list[TimedToken] = []
        self.admitted_at: float | None = None
        self.finalized_at: float | None = None
        self.finished = False  # final result collected, or cancelled
        self.released = False
        engine.add_listener(self.sid, wakeup.set_threadsafe)
        wakeup.set()

    @property
    def finalized(self) -> bool:
        return self.finalized_at is not None

    @property
    def pending_samples(self) -> int:
        return len(self._pending) // SAMPLE_BYTES

    @property
    def held_samples(self) -> int:
        """Audio (model rate) this stream holds, here and in the engine, not yet encoded."""
        consumed = int(self.consumed_seconds * self.engine.sample_rate)
        return max(0, self.pushed_samples - consumed) + self.pending_samples

    @property
    def received_samples(self) -> int:
        return self.pushed_samples + self.pending_samples

    def model_samples(self, n: int) -> int:
        """How many model-rate samples `n` samples at the input rate become (rounded up)."""
        return -(-n * self.engine.sample_rate // self.input_rate)

    def set_input_rate(self, rate: int) -> None:
        """Only before the first packet (a start message)."""
        self.input_rate = rate
        self._resampler = StreamResampler(rate)

    def position(self) -> int:
        return self.engine.queue_position(self.sid)

    def add(self, samples: np.ndarray) -> None:
        """Take a packet; at the time limit the audio is cut and the stream finalized."""
        if self.finalized:
            raise ProtocolError("stream_closed", "audio after the end of the stream")
        samples = self._resampler.push(samples)
        if self._max_samples is not None and self.received_samples + len(samples) >= self._max_samples:
            samples = samples[: self._max_samples - self.received_samples]
            self.limit_reached = True
        self._pending += memoryview(np.ascontiguousarray(samples, np.float32)).cast("B")
        if self.limit_reached:
            self.finalize()

    def flush(self, force: bool = False) -> None:
        """Hand pending audio to the engine: once admitted and at least MIN_PUSH_SECONDS
        of it (or any amount when forced)."""
        if self.admitted_at is None and not force:
            return
        if self._pending and (force or self.pending_samples >= self._min_push):
            samples = np.frombuffer(self._pending, np.float32).copy()
            self._pending = bytearray()
            self._push_engine(samples)

    def finalize(self) -> None:
        if self.finalized:
            return
        self.flush(force=True)
        self._push_engine(self._resampler.push(np.zeros(0, np.float32), last=True))
        self.finalized_at = trio.current_time()
        self.engine.finalize(self.sid)

    def collect(self) -> list[StreamResult]:
        return self.engine.collect(self.sid)

    def absorb(self, result: StreamResult) -> str:
        """Account for one collected result (in order); returns the transcript so far."""
        self.text += result.text
        self.token_count += len(result.token_ids)
        self.consumed_seconds = result.audio_seconds
        self._absorb_words(result)
        self.finished = self.finished or result.is_final
        return self.text

    def _absorb_words(self, result: StreamResult) -> None:
        """A word is complete when the next one starts, at an end of utterance, or at the end."""
        tokenizer = self.engine.model.tokenizer
        tokens, closed = self._open_word, result.is_final
        for token, seconds in zip(result.token_ids, result.token_times):
            if token == tokenizer.eou_id:
                closed = True
            elif not _special(tokenizer, token):
                tokens.append((token, seconds))
                closed = False
        groups = group_words(tokenizer, tokens)
        self._open_word = [] if closed or not groups else groups.pop()
        frame = self.engine.model.frame_seconds
        limit = self._open_word[0][1] if self._open_word else result.audio_seconds
        self.words = timed_words(tokenizer, groups, frame, limit)

    def release(self) -> float | None:
        """Free the slot (cancelling if unfinished); returns how long it was held, once."""
        if self.released:
            return None
        self.released = True
        self.cancel()
        return None if self.admitted_at is None else trio.current_time() - self.admitted_at

    def cancel(self) -> None:
        self._pending = bytearray()
        if not self.finished:
            self.finished = True
            with contextlib.suppress(EngineError):
                self.engine.cancel(self.sid)

    def _push_engine(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        try:
            self.engine.push_audio(self.sid, samples)
        except EngineError:
            return  # failed or cancelled in the engine: its final or error result tells the client
        self.pushed_samples += len(samples)


def _create(engine: ASREngine, lookahead: tuple[int, int] | None) -> int:
    try:
        return engine.create_stream(lookahead=lookahead)
    except QueueFull:
        raise ProtocolError("queue_full", "every slot is busy and the waiting queue is full") from None
    except EngineError as exc:
        if exc.code != "bad_lookahead":
            raise
        modes = ", ".join(f"{left},{right}" for left, right in engine.lookahead_modes)
        raise ProtocolError("bad_lookahead", f"lookahead must be one of: {modes}") from None


def group_words(tokenizer, tokens: list[TimedToken]) -> list[list[TimedToken]]:
    """Split tokens (no special ones) into words: a piece starting with '\u2581' starts one."""
    groups: list[list[TimedToken]] = []
    for token, seconds in tokens:
        if not groups or tokenizer.piece(token).startswith(WORD_START):
            groups.append([])
        groups[-1].append((token, seconds))
    return groups


def timed_words(tokenizer, groups: list[list[TimedToken]], frame_seconds: float, limit: float) -> list[dict]:
    """{word, start, end} per group: a word runs from its first token's frame to the end of its
    last token's frame, cut at the next word's start and at `limit` (the audio known so far, or
    where the word after the last group starts)."""
    words = []
    for i, group in enumerate(groups):
        start = min(group[0][1], limit)
        cut = groups[i + 1][0][1] if i + 1 < len(groups) else limit
        end = max(start, min(group[-1][1] + frame_seconds, cut, limit))
        if word := tokenizer.decode([token for token, _ in group]).strip():
            words.append({"word": word, "start": round(start, 3), "end": round(end, 3)})
    return words


def text_tokens(tokenizer, result: StreamResult) -> list[TimedToken]:
    """The result's tokens that are text (not <EOU>, <EOB> or blank), with their times."""
    return [(t, s) for t, s in zip(result.token_ids, result.token_times) if not _special(tokenizer, t)]


def _special(tokenizer, token: int) -> bool:
    return token in tokenizer.special_ids or token == tokenizer.blank_id

"""Each word's speaker, from a diarized segment's speaker probabilities (`StreamResult.speakers`).

A word's speaker is the one with the most summed probability over the diarizer frames of its audio
(at least one frame), among the first `max_speakers` (speakers past them merge into the most active
one allowed); speakers are numbered from 0 in the order the diarizer first heard them. Its
confidence is that speaker's mean probability over those frames. A word's times are its tokens'
frames, and the recogniser emits a token once it has heard it: about two of its frames after the
audio (TOKEN_LAG_FRAMES), so the word's audio is its times moved that much earlier. Without that, a
turn's last word would be judged by the pause after it and the next speaker's first sounds. The
engine sends a segment's results only once the diarizer has covered their words' audio, so a word's
speaker is known when it completes and never changes.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ...engine import EngineError
from ...engine.asr_engine import check_diarize
from ...engine.diarizer import TOKEN_LAG_FRAMES
from ..transport.codes import ProtocolError

if TYPE_CHECKING:
    from ...engine import EngineInfo, StreamResult


def checked_speakers(info: EngineInfo, diarize: bool, max_speakers: int | None, field: str = "max_speakers") -> int:
    """The most speakers a diarized stream tells apart (`max_speakers`, default all the diarizer's;
    not read without `diarize`); ProtocolError `diarization_unavailable` without a diarizer,
    `invalid_config` for a count out of range."""
    try:
        check_diarize(info, diarize)
    except EngineError as exc:
        raise ProtocolError(exc.code, exc.message) from None
    if not diarize or max_speakers is None:
        return info.speakers
    if isinstance(max_speakers, bool) or not isinstance(max_speakers, int) or not 1 <= max_speakers <= info.speakers:
        raise ProtocolError("invalid_config", f"'{field}' must be a whole number from 1 to {info.speakers}")
    return max_speakers


class SpeakerTimeline:
    """A segment's speaker probabilities so far, and the speaker of a word in it."""

    def __init__(self, info: EngineInfo, max_speakers: int) -> None:
        self._frame = info.speaker_frame_seconds
        self._lag = TOKEN_LAG_FRAMES * info.frame_seconds  # seconds from a word's audio to its times
        self._speakers = info.speakers
        self.max_speakers = max_speakers
        self._probs = np.zeros((0, info.speakers), np.float32)
        self._offset = 0.0  # connection seconds where its segment starts

    def add(self, result: StreamResult, offset: float = 0.0) -> None:
        """Take a result's frames; a result of a new segment (another `offset`) starts the timeline over."""
        if offset != self._offset:
            self._probs, self._offset = self._probs[:0], offset
        if result.speakers is not None and len(result.speakers):
            self._probs = np.concatenate((self._probs, result.speakers))

    def label(self, words: list[dict], confidence: bool = False) -> list[dict]:
        """The words (on the connection's clock) with "speaker" (and "speaker_confidence") added."""
        for word in words:
            speaker, sure = self.speaker(word["start"] - self._offset, word["end"] - self._offset)
            word["speaker"] = speaker
            if confidence:
                word["speaker_confidence"] = sure
        return words

    def speaker(self, start: float, end: float) -> tuple[int, float]:
        """(speaker, confidence) of the word at the segment's seconds start..end (its tokens' times)."""
        n = len(self._probs)
        if n == 0:
            return 0, 0.0
        start, end = start - self._lag, end - self._lag
        first = min(max(0, int(start / self._frame + 1e-6)), n - 1)
        stop = max(first + 1, min(math.ceil(end / self._frame - 1e-6), n))
        activity = self._probs[first:stop, : self.max_speakers].sum(0)
        speaker = int(activity.argmax())
        return speaker, round(float(activity[speaker]) / (stop - first), 3)

"""What a stream gets back: results, and how the decode stage builds them from new tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_PENDING_RESULTS = 32  # beyond this, new results merge into the newest one (nothing is dropped)


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


class ResultBuilder:
    """Turns one step's new tokens of a stream into its result: text, timing, end of utterance.

    Models with `<EOU>` end an utterance with it; others end one after `endpoint_frames` blank
    frames following a token.
    """

    def __init__(self, frame_seconds: float, eou_id: int | None, endpoint_frames: int):
        self.fs = frame_seconds
        self.eou_id = eou_id
        self.endpoint_frames = endpoint_frames

    def build(self, seq, tokens: list[tuple[int, int]], frames: int, last: bool, latency: float | None):
        """tokens: (id, frame within this step); frames: encoder frames decoded in this step."""
        ids = [tok for tok, _ in tokens]
        at = [seq.frames_decoded + t for _, t in tokens]
        seq.frames_decoded += frames
        text = seq.detok.push(ids) + (seq.detok.flush() if last else "")
        return StreamResult(
            stream_id=seq.stream_id,
            token_ids=ids,
            text=text,
            is_final=last,
            utterance_end=self._utterance_end(seq, ids, at),
            start=at[0] * self.fs if at else None,
            end=at[-1] * self.fs if at else None,
            token_times=[f * self.fs for f in at],
            audio_seconds=seq.frames_decoded * self.fs,
            latency=latency,
        )

    def _utterance_end(self, seq, ids: list[int], frames: list[int]) -> bool:
        if frames:
            seq.last_token_frame = frames[-1]
            seq.utterance_has_tokens = True
        if self.eou_id is not None:
            ended = self.eou_id in ids
            if ended:
                seq.utterance_has_tokens = ids[-1] != self.eou_id
            return ended
        if seq.utterance_has_tokens and seq.frames_decoded - 1 - seq.last_token_frame >= self.endpoint_frames:
            seq.utterance_has_tokens = False
            return True
        return False

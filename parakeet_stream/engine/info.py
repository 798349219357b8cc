"""What the engine's users (server, tools) need to know about the model it serves, as one value."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.config import Lookahead
from ..model.precision_check import PrecisionChoice
from ..model.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineInfo:
    sample_rate: int  # of the audio push_audio takes: audio.SAMPLE_RATE
    frame_seconds: float  # stream seconds per encoder frame (token times are multiples of it)
    tokenizer: Tokenizer | None
    lookahead_modes: tuple[Lookahead, ...]
    default_lookahead: Lookahead
    bulk_lookahead: Lookahead  # what a bulk stream (a file) takes unless told: the longest (policy.py)
    chunk_seconds: dict[Lookahead, float]  # audio per encoder step in each mode
    # a stream's samples that make its first chunk ready, then those each later one adds (Inbox.readiness)
    ready_samples: dict[Lookahead, tuple[int, int]]
    precision: PrecisionChoice  # the encoder's precision, and why (--dtype auto: the measured check)
    start_seconds: float  # from the engine's construction to ready: loading, precision check, graph capture
    cuda_graphs: int  # graphs captured at start-up (0: none, eager)
    start_phases: dict[str, float] = field(default_factory=dict)  # seconds: load, memory, pools, capture
    languages: tuple[str, ...] = ()  # a multilingual model's languages ("en-US", ..., "auto"); none for the others
    default_language: str | None = None  # what a stream that names none gets
    speakers: int = 0  # the diarizer's most speakers (0: no diarizer, streams cannot ask for speakers)
    speaker_frame_seconds: float = 0.0  # stream seconds per diarizer frame (StreamResult.speakers)
    endpoint_frames: int = 1  # blank encoder frames after a token that end an utterance (a model without <EOU>)

    def modes_text(self) -> str:
        """The lookahead modes as a user writes them: '70,1, 70,6'."""
        return ", ".join(f"{left},{right}" for left, right in self.lookahead_modes)

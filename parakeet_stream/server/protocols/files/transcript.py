"""A whole file's transcript, built from its stream's results: the text, the utterances and
their words with times (the word rules are the live protocols', server/streams/words.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ....engine import EngineInfo, StreamResult
from ...streams.speakers import SpeakerTimeline
from ...streams.words import TimedToken, timed_tokens, timed_words


@dataclass
class Utterance:
    text: str
    start: float
    end: float
    token_ids: list[int]
    words: list[dict]
    confidences: list[float]  # each token's probability (model/greedy.py)


@dataclass
class FileTranscript:
    text: str = ""
    duration: float = 0.0  # seconds of audio transcribed
    utterances: list[Utterance] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # every token the engine emitted, <EOU> included
    token_times: list[float] = field(default_factory=list)
    error: str | None = None
    language: str | None = None  # a multilingual model's: the file's, or the last one it detected

    @property
    def words(self) -> list[dict]:
        return [word for utterance in self.utterances for word in utterance.words]


class TranscriptBuilder:
    """Takes a stream's results in order; an utterance ends at <EOU>, at the endpointing rule's
    end of utterance (models without <EOU>) and at the end of the stream. With `diarize`, each
    word has its `speaker` and `speaker_confidence` (streams/speakers.py)."""

    def __init__(self, info: EngineInfo, diarize: bool = False) -> None:
        self._info = info
        self._speakers = SpeakerTimeline(info, info.speakers) if diarize else None
        self._tokenizer = info.tokenizer
        self._out = FileTranscript()
        self._pieces: list[str] = []
        self._open: list[TimedToken] = []  # text tokens of the utterance in progress
        self._closed: list[list[TimedToken]] = []  # utterances ended whose last word's end is not known yet
        self._settled = 0  # utterances of the transcript that `settled` handed out

    def add(self, result: StreamResult) -> str:
        """Account for one result; returns its new text (the transcript's start left-trimmed)."""
        out = self._out
        out.token_ids += result.token_ids
        out.token_times += result.token_times
        out.error = out.error or result.error
        out.language = result.language or out.language
        if self._speakers is not None:
            self._speakers.add(result)
        eou = self._tokenizer.eou_id
        for timed in timed_tokens(result):
            if timed[0] == eou:
                self._close()
            elif timed[0] not in self._tokenizer.special_ids and timed[0] != self._tokenizer.blank_id:
                if not self._open:  # the ended utterances' last words end where this one starts
                    self._settle(timed[1])
                self._open.append(timed)
        if result.is_final or (result.utterance_end and eou is None):
            self._close()
        delta = result.text if self._pieces else result.text.lstrip()
        if delta:
            self._pieces.append(delta)
        return delta

    def settled(self) -> list[Utterance]:
        """The utterances complete since the last call: ended, and their last word's end known (the
        next utterance started), in order; after `finish`, the rest."""
        new = self._out.utterances[self._settled:]
        self._settled = len(self._out.utterances)
        return new

    def finish(self, samples: int) -> FileTranscript:
        """The transcript of `samples` samples of audio (the stream's final result added)."""
        out = self._out
        out.duration = samples / self._info.sample_rate
        out.text = "".join(self._pieces).strip()
        self._settle(out.duration)
        return out

    def _settle(self, limit: float) -> None:
        """The ended utterances as Utterances, their words timed, the last one's cut at `limit`."""
        for i, tokens in enumerate(self._closed):
            words = timed_words(self._info, tokens, self._closed[i + 1][0][1] if i + 1 < len(self._closed) else limit)
            if self._speakers is not None:
                self._speakers.label(words, confidence=True)
            if words:
                ids = [timed[0] for timed in tokens]
                text = self._tokenizer.decode(ids).strip()
                self._out.utterances.append(Utterance(text, words[0]["start"], words[-1]["end"], ids, words,
                                                      [timed[2] for timed in tokens]))
        self._closed = []

    def _close(self) -> None:
        if self._open:
            self._closed.append(self._open)
            self._open = []

"""Engine results -> Riva alternatives: interim ones while an utterance grows, one final per
utterance.

An utterance ends at the model's end of utterance (the `<EOU>` token, or the engine's endpoint
rule for models without it) and at the end of the stream. Like Riva, a final transcript ends with
a space (clients concatenate the finals of a call), interim ones do not; words carry times in
milliseconds from the start of the call. Greedy streaming never revises a token once emitted, so
an interim transcript only grows: its stability is 1.0.
"""
from __future__ import annotations

from dataclasses import dataclass

from riva.client.proto import riva_asr_pb2 as rasr

from ...engine import EngineInfo, StreamResult
from ..words import TimedToken, group_words, time_groups

STABLE = 1.0


def confidence(token_ids: list[int]) -> float:
    """The confidence of a word or an alternative made of these tokens. The one place where a
    real confidence (from the joint's token probabilities, issue 24 item 4) plugs in; until the
    engine reports one, Riva's "confident" value."""
    return 1.0


@dataclass
class Piece:
    alternative: rasr.SpeechRecognitionAlternative
    is_final: bool
    audio_processed: float  # seconds of the call's audio processed when it was made


class Transcript:
    def __init__(self, info: EngineInfo, interim: bool, words: bool) -> None:
        self._info = info
        self._tokenizer = info.tokenizer
        self._not_text = info.tokenizer.special_ids | {info.tokenizer.blank_id}  # <EOU> included
        self._endpoint_only = info.tokenizer.eou_id is None  # the engine's rule ends utterances
        self._interim = interim
        self._words = words
        self._tokens: list[TimedToken] = []  # the open utterance

    def add(self, result: StreamResult, received_seconds: float) -> list[Piece]:
        """What to send for one result; `received_seconds`: the audio the stream took so far."""
        processed = min(result.audio_seconds, received_seconds)
        out: list[Piece] = []
        grew = False
        for token, seconds in zip(result.token_ids, result.token_times):
            if token == self._tokenizer.eou_id:
                out += self._close(processed)
                grew = False
            elif token not in self._not_text:
                self._tokens.append((token, seconds))
                grew = True
        if result.is_final or (result.utterance_end and self._endpoint_only):
            out += self._close(processed)
        elif grew and self._interim:
            alternative = rasr.SpeechRecognitionAlternative(transcript=self._decode(self._tokens))
            out.append(Piece(alternative, False, processed))
        return out

    def _close(self, processed: float) -> list[Piece]:
        tokens, self._tokens = self._tokens, []
        text = self._decode(tokens)
        if not text:
            return []
        alternative = rasr.SpeechRecognitionAlternative(
            transcript=text + " ",
            confidence=confidence([t for t, _ in tokens]),
            words=self._timed(tokens, processed) if self._words else [],
        )
        return [Piece(alternative, True, processed)]

    def _timed(self, tokens: list[TimedToken], limit: float) -> list[rasr.WordInfo]:
        groups = [g for g in group_words(self._info, tokens) if self._decode(g)]
        words = time_groups(self._info, groups, limit)
        return [
            rasr.WordInfo(
                word=w["word"], start_time=round(w["start"] * 1000), end_time=round(w["end"] * 1000),
                confidence=confidence([t for t, _ in group]),
            )
            for w, group in zip(words, groups)
        ]

    def _decode(self, tokens: list[TimedToken]) -> str:
        return self._tokenizer.decode([t for t, _ in tokens]).strip()

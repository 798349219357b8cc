"""Engine results -> Riva alternatives: interim ones while an utterance grows, one final per
utterance.

An utterance ends at the model's end of utterance (the `<EOU>` token, or the engine's endpoint
rule for models without it) and at the end of the stream. Like Riva, a final transcript ends with
a space (clients concatenate the finals of a call), interim ones do not; words carry times in
milliseconds from the start of the call. Greedy streaming never revises a token once emitted, so
an interim transcript only grows: its stability is 1.0. A final's confidence and its words' are
the model's (server/streams/words.py). A multilingual model's alternatives and words carry its
language (`language_code`: the stream's, or the one the model identified last). With diarization,
a final's words carry `speaker_tag`, the word's speaker numbered from 1 (streams/speakers.py
numbers them from 0); it lives on the words, so they come with it even without
`enable_word_time_offsets`. Like Riva's, interim results carry no words.
"""
from __future__ import annotations

from dataclasses import dataclass

from riva.client.proto import riva_asr_pb2 as rasr

from ....engine import EngineInfo, StreamResult
from ...streams.speakers import SpeakerTimeline
from ...streams.words import TimedToken, group_words, time_groups, timed_tokens, transcript_confidence

STABLE = 1.0


@dataclass
class Piece:
    alternative: rasr.SpeechRecognitionAlternative
    is_final: bool
    audio_processed: float  # seconds of the call's audio processed when it was made


class Transcript:
    def __init__(self, info: EngineInfo, interim: bool, words: bool, max_speakers: int | None = None) -> None:
        """`max_speakers`: the speakers a diarized call tells apart (None: no diarization)."""
        self._info = info
        self._tokenizer = info.tokenizer
        self._not_text = info.tokenizer.special_ids | {info.tokenizer.blank_id}  # <EOU> included
        self._endpoint_only = info.tokenizer.eou_id is None  # the engine's rule ends utterances
        self._interim = interim
        self._speakers = None if max_speakers is None else SpeakerTimeline(info, max_speakers)
        self._words = words or self._speakers is not None
        self._tokens: list[TimedToken] = []  # the open utterance
        self._language = ""  # language_code: the stream's language, once known

    def add(self, result: StreamResult, received_seconds: float) -> list[Piece]:
        """What to send for one result; `received_seconds`: the audio the stream took so far."""
        processed = min(result.audio_seconds, received_seconds)
        self._language = result.language or self._language
        if self._speakers is not None:
            self._speakers.add(result)
        out: list[Piece] = []
        grew = False
        for timed in timed_tokens(result):
            if timed[0] == self._tokenizer.eou_id:
                out += self._close(processed)
                grew = False
            elif timed[0] not in self._not_text:
                self._tokens.append(timed)
                grew = True
        if result.is_final or (result.utterance_end and self._endpoint_only):
            out += self._close(processed)
        elif grew and self._interim:
            alternative = rasr.SpeechRecognitionAlternative(transcript=self._decode(self._tokens),
                                                            language_code=self._languages())
            out.append(Piece(alternative, False, processed))
        return out

    def _close(self, processed: float) -> list[Piece]:
        tokens, self._tokens = self._tokens, []
        text = self._decode(tokens)
        if not text:
            return []
        words = time_groups(self._info, group_words(self._info.tokenizer, tokens), processed)
        if self._speakers is not None:
            self._speakers.label(words)
        alternative = rasr.SpeechRecognitionAlternative(
            transcript=text + " ",
            confidence=transcript_confidence(words),
            words=[_word_info(w, self._language) for w in words] if self._words else [],
            language_code=self._languages(),
        )
        return [Piece(alternative, True, processed)]

    def _languages(self) -> list[str]:
        return [self._language] if self._language else []

    def _decode(self, tokens: list[TimedToken]) -> str:
        return self._tokenizer.decode([t[0] for t in tokens]).strip()


def _word_info(word: dict, language: str) -> rasr.WordInfo:
    return rasr.WordInfo(word=word["word"], start_time=round(word["start"] * 1000),
                         end_time=round(word["end"] * 1000), confidence=word["confidence"], language_code=language,
                         speaker_tag=word["speaker"] + 1 if "speaker" in word else 0)

"""A Riva `RecognitionConfig` -> what this server does with it (docs/protocol.md section 2e).

Served: `encoding` LINEAR_PCM / MULAW / ALAW (or unset: a WAV header, else LINEAR_PCM), any
`sample_rate_hertz` (resampled), `interim_results`, `enable_word_time_offsets`, `language_code` (a
language the model transcribes: English for the English models, `model_language`), and
`speech_contexts` (word boosting: every phrase of every context is a key phrase, its `boost`
divided by BOOST_PER_WEIGHT is the phrase's weight, 0 or unset the default weight), and
`diarization_config` (each final word's speaker, with the server's --diarizer; `max_speaker_count`
0 or unset: all the diarizer's speakers, more than it has: clamped to them).
Accepted and ignored, because they only tune what NVIDIA's models do (our model decides its own
punctuation and endpoints): `model`, `max_alternatives` (one is returned), `profanity_filter`,
`enable_automatic_punctuation`, `verbatim_transcripts`, `endpointing_config`,
`custom_configuration`, `enable_separate_recognition_per_channel` (one channel), `runtime_config`.
Refused (INVALID_ARGUMENT), because the answer would silently differ from what was asked: a
language the model does not transcribe, more than one channel, FLAC or OGG/Opus audio, a negative
boost (suppressing words), key phrases beyond their limits, a negative `max_speaker_count`, and
diarization asked of a server without a diarizer (`diarization_unavailable`).
"""
from __future__ import annotations

from dataclasses import dataclass

from riva.client.proto.riva_asr_pb2 import RecognitionConfig
from riva.client.proto.riva_audio_pb2 import AudioEncoding

from .... import audio
from ....engine import EngineError
from ....engine.phrases import MAX_WEIGHT, Phrase, PhraseError, check_phrases
from ...streams.speakers import checked_speakers
from ...transport.codes import ProtocolError
from .errors import RivaError

ENCODINGS = {
    AudioEncoding.ENCODING_UNSPECIFIED: None,  # a WAV header says, else LINEAR_PCM
    AudioEncoding.LINEAR_PCM: "pcm16",
    AudioEncoding.MULAW: "mulaw",
    AudioEncoding.ALAW: "alaw",
}
LANGUAGE = "en-US"  # what the models without language prompts speak (English; any en-* tag is accepted)
BOOST_PER_WEIGHT = 20.0  # the boost Riva's word-boosting docs suggest is our default weight, 1
MAX_BOOST = BOOST_PER_WEIGHT * MAX_WEIGHT


@dataclass(frozen=True)
class Options:
    encoding: str | None  # a server/streams/wire.py decoder name; None: a WAV header or else pcm16
    sample_rate: int | None  # None: from a WAV header
    interim_results: bool = False
    word_time_offsets: bool = False
    phrases: tuple[Phrase, ...] = ()
    language: str | None = None  # language_code as asked (None: unset)
    diarize: bool = False
    max_speakers: int = 0  # max_speaker_count as asked (0: all)


def parse_config(config: RecognitionConfig, interim_results: bool = False) -> Options:
    """Raises RivaError("invalid_config") for what we do not serve."""
    if config.encoding not in ENCODINGS:
        name = AudioEncoding.Name(config.encoding) if config.encoding in AudioEncoding.values() else config.encoding
        raise RivaError("invalid_config", f"encoding {name} is not supported: use LINEAR_PCM, MULAW or ALAW")
    if config.audio_channel_count > 1:
        raise RivaError("invalid_config", "audio_channel_count must be 1: only mono audio is supported")
    diarization = config.diarization_config
    if diarization.enable_speaker_diarization and diarization.max_speaker_count < 0:
        raise RivaError("invalid_config", "diarization_config.max_speaker_count must be 0 (all speakers) or more")
    return Options(
        encoding=ENCODINGS[config.encoding],
        sample_rate=_rate(config.sample_rate_hertz),
        interim_results=interim_results,
        word_time_offsets=config.enable_word_time_offsets,
        phrases=_phrases(config.speech_contexts),
        language=config.language_code.strip() or None,
        diarize=diarization.enable_speaker_diarization,
        max_speakers=diarization.max_speaker_count,
    )


def model_language(engine, options: Options) -> str | None:
    """The model's name for the language asked (engine.check_language); INVALID_ARGUMENT otherwise."""
    try:
        return engine.check_language(options.language)
    except EngineError as exc:
        raise RivaError("invalid_config", f"language_code: {exc.message}") from None


def speaker_count(engine, options: Options) -> int | None:
    """The most speakers a diarized call tells apart (streams/speakers.py), None without
    diarization; INVALID_ARGUMENT `diarization_unavailable` on a server without a diarizer."""
    if not options.diarize:
        return None
    most = min(options.max_speakers, engine.info.speakers) or None
    try:
        return checked_speakers(engine.info, True, most)
    except ProtocolError as exc:
        raise RivaError(exc.code, f"diarization_config: {exc.message}") from None


def _phrases(contexts) -> tuple[Phrase, ...]:
    items = []
    for context in contexts:
        if not 0 <= context.boost <= MAX_BOOST:
            raise RivaError(
                "invalid_phrases", f"speech_contexts: boost must be from 0 to {MAX_BOOST:g} "
                "(a negative boost, which suppresses words, is not supported)"
            )
        weight = context.boost / BOOST_PER_WEIGHT if context.boost else None
        items += [(phrase, weight) for phrase in context.phrases]
    try:
        return check_phrases(items)
    except PhraseError as exc:
        raise RivaError(exc.code, f"speech_contexts: {exc.message}") from None


def _rate(hertz: int) -> int | None:
    if hertz == 0:
        return None
    try:
        return audio.check_rate(hertz)
    except audio.AudioError as exc:
        raise RivaError("invalid_config", f"sample_rate_hertz: {exc}") from None

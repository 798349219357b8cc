"""Key phrases through the engine with the bundled demo model, on espeak-ng speech made at test time
(sentences of the set evaluations/phrase_eval.py measured before it was split into halves): boosting recovers names the model misses, inserts none
where they are not said, and a step mixing streams with and without phrases gives each stream its
tokens, through the static batches (the CUDA graphs' stand-in) as eagerly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import collect_until_final, demo_pins, tokens_of
from test_demo_model import DEMO, synth

from evaluations.phrase_eval import contains
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.phrases import Phrase, check_phrases

pytestmark = pytest.mark.skipif(not (DEMO / "model.safetensors").is_file() or shutil.which("espeak-ng") is None,
                                reason="needs weights/demo and espeak-ng (see test_demo_model.py)")

PHRASES = {  # kind -> words the demo model's 10,000-word vocabulary lacks
    "person": ["kowalski", "nguyen", "papadopoulos", "wojciechowski", "okonkwo", "tchaikovsky", "gorbachev"],
    "place": ["reykjavik", "ouagadougou", "kilimanjaro", "zanzibar", "titicaca"],
    "drug": ["ibuprofen", "metformin", "lisinopril", "azithromycin", "acetaminophen"],
    "product": ["kubernetes", "photoshop", "netflix"],
}
CARRIERS = {
    "person": ["i spoke with {} about the new plan", "please call {} before the meeting tomorrow"],
    "place": ["we flew to {} last summer", "the road to {} was long and dusty"],
    "drug": ["the doctor told me to take {} twice a day", "she stopped taking {} last week"],
    "product": ["we moved all our work to {} last month", "my brother says {} is too expensive"],
}
VOICES = [("en-us", "default", 160, 50), ("en", "m3", 150, 45), ("en-gb-x-rp", "f2", 165, 55),
          ("en-us-nyc", "Andy", 155, 40)]
FIXTURE = Path(__file__).parent / "fixtures" / "demo_sentences.json"


def phrase_set() -> tuple[list[dict], list[dict]]:
    """(40 sentences with a phrase, the 40 held-out sentences of demo_sentences.json, which hold none)."""
    with_phrase = []
    for kind, words in PHRASES.items():
        for word in words:
            for carrier in CARRIERS[kind]:
                voice, variant, speed, pitch = VOICES[len(with_phrase) % len(VOICES)]
                with_phrase.append({"text": carrier.format(word), "phrase": word, "voice": voice,
                                    "variant": variant, "speed": speed, "pitch": pitch})
    fixture = json.loads(FIXTURE.read_text())
    return with_phrase, fixture["seen_voices"] + fixture["heldout_voices"]


def all_phrases() -> tuple[Phrase, ...]:
    return check_phrases([w for words in PHRASES.values() for w in words])


# The bundled model's own counts on these 10 sentences, every phrase of PHRASES boosted at the defaults
# (tests/fixtures/demo_pins.json, measured from it by tests/fixtures/make_demo_pins.py): the phrases
# found without boosting and with it, and how many of the 4 phrase-free sentences get a phrase;
# asserted with a margin of one.
PICKED = range(0, 40, 4)  # one sentence of every other phrase


@pytest.fixture(scope="module")
def audios():
    return picked_audios()


def picked_audios() -> tuple[list[dict], list[np.ndarray]]:
    """The picked phrase sentences and the audio of them and of 4 phrase-free ones."""
    with_items, without_items = phrase_set()
    picked = [with_items[k] for k in PICKED]
    return picked, [synth(item, seed=k) for k, item in enumerate(picked + without_items[:4])]


def run_all(engine, audios, phrases_of) -> list[list]:
    sids = [engine.create_stream(phrases=phrases_of(k)) for k in range(len(audios))]
    for sid, audio in zip(sids, audios):
        engine.push_audio(sid, audio)
        engine.finalize(sid)
    return [collect_until_final(engine, sid) for sid in sids]


def phrase_counts(engine, audios) -> dict:
    """Of the picked sentences, how many hold their phrase without boosting and with every phrase
    boosted, and of the phrase-free ones, how many phrases boosting inserts."""
    items, sounds = audios
    phrases = all_phrases()
    plain = run_all(engine, sounds, lambda k: ())
    boosted = run_all(engine, sounds, lambda k: phrases)
    text = [["".join(r.text for r in results) for results in run] for run in (plain, boosted)]
    print("plain:", text[0], "\nboosted:", text[1])
    found = [sum(contains(t, item["phrase"]) > 0 for t, item in zip(run, items)) for run in text]
    inserted = sum(contains(t, p.text) for t in text[1][len(items):] for p in phrases)
    return {"plain": found[0], "boosted": found[1], "inserted": inserted}


def test_boosting_recovers_missed_phrases_and_inserts_next_to_none(audios):
    with ASREngine("demo", max_num_streams=8) as engine:
        got = phrase_counts(engine, audios)
    pinned = demo_pins()["phrases"]
    print("found:", got, "pinned:", pinned)
    assert got["plain"] <= pinned["plain"] + 1 and got["boosted"] >= pinned["boosted"] - 1
    assert got["boosted"] > got["plain"] and got["inserted"] <= pinned["inserted"] + 1


def test_a_mixed_step_gives_each_stream_its_tokens_eagerly_and_through_static_batches(audios):
    items, sounds = audios
    phrases = all_phrases()
    has = lambda k: phrases if k % 2 == 0 else ()  # noqa: E731
    with ASREngine("demo", max_num_streams=8) as engine:
        plain = [tokens_of(r) for r in run_all(engine, sounds, lambda k: ())]
        eager = [tokens_of(r) for r in run_all(engine, sounds, has)]
        alone = [tokens_of(run_all(engine, [sound], lambda _: has(k))[0]) for k, sound in enumerate(sounds)]
    with ASREngine("demo", max_num_streams=8, max_batch=6, cuda_graphs=True) as engine:
        static = [tokens_of(r) for r in run_all(engine, sounds, has)]
        used = list(engine.runner.beam_decoders.values())
        assert sum(s.replays for s in used) > 0 and sum(s.eager_calls for s in used) == 0
    assert eager == alone == static
    assert all(eager[k] == plain[k] for k in range(1, len(sounds), 2))  # no phrases: as without boosting
    assert any(eager[k] != plain[k] for k in range(0, len(sounds), 2))


def test_a_stream_with_phrases_ends_its_utterances_when_the_model_says_so(audios):
    """A live stream goes on after the speaker stops (silence here): its utterance end comes when
    the model writes <EOU>, within a chunk of the same stream without phrases, not a commit lag later."""
    _, sounds = audios
    silence = np.zeros(24000, np.float32)
    live = [np.concatenate([sound, silence]) for sound in sounds]
    phrases = all_phrases()

    def ends(run):
        return [next(r.audio_seconds for r in results if r.utterance_end) for results in run]

    with ASREngine("demo", max_num_streams=8) as engine:
        plain, boosted = ends(run_all(engine, live, lambda k: ())), ends(run_all(engine, live, lambda k: phrases))
    chunk = engine.chunk_seconds()
    late = [b - p for p, b in zip(plain, boosted)]
    print("utterance ends, seconds later with phrases:", late)
    assert all(b < len(s) / 16000 - 0.5 for b, s in zip(boosted, live))  # before the stream's end
    assert max(late) <= chunk + 1e-6


def test_a_partial_match_does_not_swallow_the_words_the_audio_says():
    """A control of the evaluation set that once lost its last word: every hypothesis followed a
    listed phrase's first letters ("red b-lo..." for Blockchain) and none wrote "ball"."""
    from evaluations.phrase_eval import audio_of, text_of
    from evaluations.phrase_set import build

    sentence = next(s for s in build() if s["text"] == "the little boy lost his red ball")
    assert "blockchain" in sentence["listed"]
    with ASREngine("demo", max_num_streams=2) as engine:
        plain, boosted = (text_of(run_all(engine, [audio_of(sentence)], lambda k: listed)[0])
                          for listed in ((), check_phrases(sentence["listed"])))
    print("plain:", plain, "| boosted:", boosted)
    assert plain.split()[-1] == "ball" and boosted.split()[-1] == "ball"

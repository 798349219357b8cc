"""The key-phrase evaluation's pure parts (evaluations/phrase_eval.py, evaluations/phrase_set.py): whole-word
matching, the failure counts, the other words' errors, and a set that is deterministic and split
by phrase. No model is run."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from demo_model import data as demo_data
from evaluations import phrase_eval as pe
from evaluations import phrase_set as ps

ROOT = Path(__file__).resolve().parent.parent

FORTUNES = Path("/usr/share/games/fortunes")


def test_contains_counts_whole_words_after_folding_case_and_accents():
    assert pe.contains("the cat sat", "cat") == 1
    assert pe.contains("the catalog sat", "cat") == 0
    assert pe.contains("we went to sao paulo", "São Paulo") == 1
    assert pe.contains("we went to sao", "São Paulo") == 0
    assert pe.contains("zoe unal zoe unal zoe unal", "Zoë Ünal") == 3  # back to back, each counted


def test_inserted_counts_listed_phrases_never_spoken():
    listed = ["Mailchimp", "Spotify", "Zoë Ünal"]
    assert pe.inserted("drink more water", "drink mailchimp water", listed) == ["Mailchimp"]
    assert pe.inserted("i use spotify", "i use spotify", listed) == []  # spoken: not an insertion
    assert pe.inserted("i use spotify", "i use spotify mailchimp", listed) == ["Mailchimp"]


def test_runaway_counts_phrases_found_more_often_than_spoken():
    listed = ["Zoë Ünal", "Spotify"]
    assert pe.runaway("ask zoe unal now", "ask zoe unal zoe unal zoe unal", listed) == ["Zoë Ünal"]
    assert pe.runaway("ask zoe unal now", "ask zoe unal now", listed) == []
    assert pe.runaway("ask zoe unal now", "ask spotify now", listed) == []  # one insertion is no runaway
    assert pe.runaway("ask zoe unal now", "spotify zoe unal spotify", listed) == ["Spotify"]


def test_fragments_are_unsaid_prefixes_of_a_listed_phrase_that_is_not_spoken():
    assert pe.fragments("drink more water", "drink mai", ["Mailchimp", "Spotify"]) == ["mai"]
    assert pe.fragments("drink more water", "drink mai mai", ["Mailchimp"]) == ["mai", "mai"]
    # where the phrase is spoken, the model splitting it is not a fragment
    assert pe.fragments("she told me about mailchimp", "she told me about mail chimp", ["Mailchimp"]) == []
    # too short, the whole word, or a word of the set's own
    assert pe.fragments("drink more water", "drink ma mailchimp", ["Mailchimp"]) == []
    assert pe.fragments("a b", "the b", ["thermocouple"], common=frozenset({"the"})) == []
    assert pe.fragments("a b", "the b", ["thermocouple"]) == ["the"]


def test_other_word_errors_leave_out_the_phrase_and_what_stands_in_its_place():
    ref = "i spoke with kowalski about the new plan"
    assert pe.other_word_errors(ref, ["Kowalski"], "i spoke with cow sky about the new plan") == (0, 7)
    assert pe.other_word_errors(ref, ["Kowalski"], "i spoke with kowalski netflix about the new plan") == (0, 7)
    assert pe.other_word_errors(ref, ["Kowalski"], "i spoke to kowalski about the plan") == (2, 7)
    assert pe.other_word_errors(ref, ["Kowalski"], "i spoke with about the new plan") == (0, 7)
    assert pe.other_word_errors(ref, [], ref.replace("new", "old")) == (1, 8)  # a control: plain WER
    two = "ask zoe unal to fly to sao paulo soon"
    assert pe.other_word_errors(two, ["São Paulo", "Zoë Ünal"], "ask zoe to fly to sao soon") == (0, 5)
    assert pe.other_word_errors(two, ["São Paulo", "Zoë Ünal"], "ask zoe unal fly to sao paulo") == (2, 5)


def test_score_counts_recall_per_kind_insertions_and_both_wers():
    sentences = [
        {"id": "a", "kind": "drug", "text": "take warfarin daily", "phrases": ["warfarin"],
         "listed": ["warfarin", "Spotify"], "near": []},
        {"id": "b", "kind": "person", "text": "call hartigan now", "phrases": ["Hartigan"],
         "listed": ["Hartigan", "Spotify"], "near": []},
        {"id": "c", "kind": "control", "text": "drink more water", "phrases": [], "listed": ["Mailchimp", "Spotify"],
         "near": []},
        {"id": "d", "kind": "control", "text": "what's up with you", "phrases": [], "listed": ["WhatsApp", "Spotify"],
         "near": ["WhatsApp"]},
    ]
    figures = pe.score(sentences, ["take warfarin daily", "call hearty gun now spotify", "drink mai water",
                                   "whatsapp with you"])
    assert (figures["found"], figures["spoken"], figures["recall"]) == (1, 2, 0.5)
    assert figures["recall_by_kind"]["drug"] == 1.0 and figures["recall_by_kind"]["person"] == 0.0
    assert (figures["inserted"], figures["inserted_sound_alike"], figures["runaway"], figures["fragments"]) == (2, 1, 0, 1)
    assert [e["id"] for e in figures["events"]["inserted"]] == ["b", "d"]
    assert figures["wer_other_words"] == 0.25  # "spotify" after "now": 1 of 4 words
    assert figures["wer_controls"] == round(3 / 7, 4)  # "mai"; "whatsapp" for "what's up"
    assert figures["wer_unrelated_controls"] == round(1 / 3, 4)  # the sound-alike control left out


def test_the_set_is_large_varied_and_split_by_phrase_and_carrier():
    sentences = ps.build()
    phrases = [p for kinds in (ps.PHRASES, ps.FRESH_PHRASES) for kind in kinds.values() for p in kind]
    assert len(phrases) >= 60 and len(set(phrases)) == len(phrases) and len(ps.PHRASES) == 5
    assert any(" " in p for p in ps.PHRASES["person"]) and any(" " in p for p in ps.PHRASES["product"])
    controls = [s for s in sentences if s["kind"] == "control"]
    assert len(controls) >= 40 and all(not s["phrases"] for s in controls)
    carriers = collections.defaultdict(set)  # phrase -> its carriers
    for s in sentences:
        for p in s["phrases"]:
            carriers[p].add(s["text"].replace(ps.words_of(p), "{}"))
    assert set(carriers) == set(phrases) and all(len(c) == 3 for c in carriers.values())
    assert len(set(map(frozenset, carriers.values()))) > len(phrases) / 2  # not one carrier triple for all

    def half(split):
        mine = [s for s in sentences if s["split"] == split]
        return ({p for s in mine for p in s["phrases"]}, {w for s in mine for p in s["listed"] for w in ps.words_of(p).split()},
                {c for s in mine for p in s["phrases"] for c in carriers[p]}, {s["text"] for s in mine if not s["phrases"]})

    (spoken_t, words_t, carriers_t, controls_t), (spoken_h, words_h, carriers_h, controls_h) = half("tune"), half("heldout")
    assert spoken_t and spoken_h and not spoken_t & spoken_h
    held_words = {w for p in spoken_h for w in ps.words_of(p).split()}
    assert not held_words & words_t  # no word of a held-out phrase is even listed in the tuning half
    assert not carriers_t & carriers_h and not controls_t & controls_h
    assert len(controls_h) >= 20 and len(controls_t) >= len(controls_h)  # the tuning half has controls of its own
    spoken_f, words_f, carriers_f, controls_f = half("fresh")  # the fresh part shares nothing with the halves
    assert len(spoken_f) >= 30 and len(controls_f) >= 15
    assert not words_f & (words_t | words_h) and not carriers_f & (carriers_t | carriers_h)
    assert not controls_f & (controls_t | controls_h)


def test_every_sentence_lists_its_phrases_and_never_spoken_others_of_its_half():
    sentences = ps.build()
    for s in sentences:
        spoken = [p for p in s["listed"] if pe.contains(s["text"], p)]
        assert sorted(spoken) == sorted(s["phrases"])
        assert len(set(s["listed"])) == len(s["listed"])
        if s["phrases"]:
            assert len(s["listed"]) == len(s["phrases"]) + ps.DISTRACTORS_PER_SENTENCE
        else:
            assert 20 <= len(s["listed"]) <= 50 and set(s["near"]) <= set(s["listed"])
    lengths = {len(s["listed"]) for s in sentences if s["kind"] == "control"}
    assert len(lengths) > 5


def test_voices_are_mostly_unseen_in_training_with_mixed_speeds_and_pitches():
    trained = {(a, v) for a in demo_data.TRAIN_ACCENTS for v in demo_data.TRAIN_VARIANTS}
    assert not set(ps.UNSEEN) & trained and set(ps.SEEN) <= trained
    sentences = ps.build()
    unseen = sum((s["voice"], s["variant"]) in ps.UNSEEN for s in sentences)
    assert unseen > 0.6 * len(sentences)
    assert len({s["speed"] for s in sentences}) >= 6 and len({s["pitch"] for s in sentences}) >= 5
    assert len({(s["voice"], s["variant"]) for s in sentences}) >= 20


def test_the_set_is_the_same_in_every_process():
    code = "import json; from evaluations import phrase_set; print(json.dumps(phrase_set.build()))"
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1] and json.loads(runs[0]) == json.loads(json.dumps(ps.build()))


@pytest.mark.skipif(not FORTUNES.is_dir(), reason="fortunes is not installed (scripts/test.sh installs it)")
def test_phrase_words_are_outside_the_demo_vocabulary_and_carrier_words_inside():
    words = collections.Counter(w for s in demo_data.read_fortunes() for w in demo_data.normalize(s) or [])
    vocab = {w for w, _ in words.most_common(10_000)} | demo_data.NUMBER_WORDS  # the demo corpus's --vocab-size
    listed = {w for s in ps.build() for p in s["listed"] for w in ps.words_of(p).split()}
    assert not listed & vocab
    assert pe.common_words() <= vocab


def test_param_sets_a_decoder_knob_and_refuses_unknown_names(monkeypatch):
    from parakeet_stream.engine import phrases
    from parakeet_stream.model import boosting

    # knobs of their own, so that the test outlives the decoder's (restored after the test)
    monkeypatch.setattr(phrases, "TEST_KNOB", 4.5, raising=False)
    monkeypatch.setattr(boosting, "TEST_KNOB", 0.5, raising=False)
    assert pe.set_params(["phrases.TEST_KNOB=3.25", "boosting.TEST_KNOB=1", "phrases.TEST_KNOB = 2"]) == {
        "phrases.TEST_KNOB": 2, "boosting.TEST_KNOB": 1}
    assert phrases.TEST_KNOB == 2 and boosting.TEST_KNOB == 1
    pe.set_params(["parakeet_stream.model.boosting.TEST_KNOB=beam"])
    assert boosting.TEST_KNOB == "beam"
    for bad in ("phrases.NO_SUCH_KNOB=1", "nowhere.TEST_KNOB=1", "TEST_KNOB=1", "phrases.TEST_KNOB", "os.sep=1"):
        with pytest.raises(ValueError):
            pe.set_params([bad])


def test_the_best_bound_keeps_the_most_said_phrases_within_the_insertion_limit():
    def row(id_, phrase, spoken, mean):
        return {"id": id_, "split": "tune", "phrase": phrase, "spoken": spoken, "mean": mean}

    found = [row("a", "Oksana", True, -1.0), row("a", "Oksana", True, -6.0),  # one sentence, two finds: its best counts
             row("b", "Peloton", True, -2.0), row("c", "Spotify", False, -2.5), row("d", "Shopify", False, -3.0),
             row("e", "Winnipeg", False, -3.5), row("f", "Ferreira", True, -4.0)]
    figures = pe.best_bound(found, spoken=5, most_inserted=2)
    assert (figures["found"], figures["inserted"]) == (0.6, 3)  # 3 of 5 said phrases found at all, 3 unsaid
    assert figures["best_bound"] == {"bound": -3.0, "recall": 0.4, "inserted": 2}  # -4.0 would let in a third
    assert pe.best_bound(found, spoken=5, most_inserted=0)["best_bound"] == {"bound": -2.0, "recall": 0.4, "inserted": 0}
    assert pe.best_bound(found, spoken=5, most_inserted=3)["best_bound"] == {"bound": -4.0, "recall": 0.6, "inserted": 3}
    assert pe.best_bound([], spoken=5)["best_bound"] == {"bound": None, "recall": 0.0, "inserted": 0}
    # another field ranks the finds its own way: the unsaid ones last, every said one kept
    ranked = [dict(r, need=-1.0 if r["spoken"] else -9.0) for r in found]
    assert pe.best_bound(ranked, spoken=5, most_inserted=0, field="need")["best_bound"] == \
        {"bound": -1.0, "recall": 0.6, "inserted": 0}


def test_transcripts_are_folded_to_the_sets_words_before_scoring():
    results = [SimpleNamespace(text=" Priya Raghunathan called."), SimpleNamespace(text=" Zoë's São Paulo trip!")]
    assert pe.text_of(results) == "priya raghunathan called zoe's sao paulo trip"
    assert pe.contains(pe.text_of(results), "Priya Raghunathan") == 1

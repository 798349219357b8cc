"""Where written sentences end (parakeet_stream/sentence_ends.py) and the counts behind it
(demo_model/sentence_ends.py)."""
from __future__ import annotations

import gzip
import json

import pytest

from demo_model import sentence_ends as build
from demo_model.data import FORTUNE_DIR, fortune_files
from parakeet_stream import sentence_ends
from parakeet_stream.sentence_ends import SHRINK, TABLE, end_chance, words_of


def test_counts_say_how_often_a_sentence_ended_after_each_context(monkeypatch):
    monkeypatch.setattr(build, "MIN_COUNT", 1)
    table = build.count([["go", "to", "the", "shop"], ["go", "home"], ["the", "end"]])
    contexts = table["contexts"]
    assert table["base"] == 3 / 8 and table["sentences"] == 3
    assert contexts["the"] == [0, 2] and contexts["go"] == [0, 2] and contexts["home"] == [1, 1]
    assert contexts["<s> go"] == [0, 2] and contexts["<s> <s> the"] == [0, 1] and contexts["to the shop"] == [1, 1]
    monkeypatch.setattr(build, "MIN_COUNT", 2)
    assert set(build.count([["go", "to", "the", "shop"], ["go", "home"], ["the", "end"]])["contexts"]) == {
        "the", "go", "<s> go", "<s> <s> go"}


def test_the_chance_backs_off_from_three_words_shrunk_toward_fewer():
    data = json.loads(gzip.decompress(TABLE.read_bytes()))
    contexts = data["contexts"]
    words = ["to", "the"]
    assert all(c in contexts for c in ("the", "to the", "<s> to the"))
    chance = data["base"]
    for context in ("the", "to the", "<s> to the"):
        ends, total = contexts[context]
        chance = (ends + SHRINK * chance) / (total + SHRINK)
    assert end_chance(" ".join(words)) == pytest.approx(chance)
    assert end_chance("send it to the") < 0.005 < end_chance("send it to the office")


def test_a_models_punctuation_and_capitals_are_read_as_words_and_ends():
    assert words_of("Send it to O’Brien, then") == ["send", "it", "to", "o'brien", "then"]
    assert end_chance("Send it to the.") == 1.0 and end_chance("Is it?") == 1.0
    assert end_chance("Send it to the,") == end_chance("send it to the")


def test_the_sentences_measured_on_are_never_counted(tmp_path):
    text = tmp_path / "demo" / "text"
    text.mkdir(parents=True)
    (text / "test_sentences.txt").write_text("a held out sentence\n")
    (text / "test_voices.txt").write_text("another one\n")
    held = build.held_out(text)
    fixture = json.loads(build.FIXTURE.read_text())
    assert {"a held out sentence", "another one", fixture["seen_voices"][0]["text"]} <= held
    assert sentence_ends._table()[1]  # and the shipped table loads


@pytest.mark.skipif(not FORTUNE_DIR.is_dir(), reason="Debian's fortunes are not installed (scripts/test.sh installs them)")
def test_the_shipped_table_is_what_its_command_counts(tmp_path):
    counted = json.loads(gzip.decompress(TABLE.read_bytes()))["fortunes"]
    if [p.name for p in fortune_files()] != counted:
        pytest.skip("this machine's fortune files are not the ones counted (another fortunes package is installed)")
    out = tmp_path / "table.json.gz"
    build.main(["--out", str(out), "--text", str(tmp_path / "demo" / "text")])
    assert out.read_bytes() == TABLE.read_bytes()


def test_the_evaluation_counts_held_hesitations_and_held_ends(tmp_path):
    (tmp_path / "test_sentences.txt").write_text("the office\nthe end\nsend it to the office\none\n")
    got = build.evaluate(tmp_path)
    # three sentences of two words or more; cut after "the" twice, and somewhere in the third
    assert got["sentences"] == 3 and got["ends_held"] == 0.0 and got["cuts_held"] >= 2 / 3 - 1e-3


@pytest.mark.parametrize("argv, said", [(["--text", "nowhere"], "--text nowhere"),
                                        (["--out", "/nonexistent/dir/t.json.gz"], "no folder /nonexistent/dir")])
def test_bad_paths_are_refused_in_one_line_before_anything_is_built(tmp_path, argv, said):
    with pytest.raises(SystemExit, match=said):
        build.main(argv + ([] if "--text" in argv else ["--text", str(tmp_path / "c" / "text")]))
    assert not (tmp_path / "c").exists()


def test_a_long_text_is_judged_by_its_last_words():
    assert end_chance("and so on " * 500 + "send it to the") == end_chance("please send it to the") < 0.005

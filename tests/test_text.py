"""Words in scripts written without spaces (parakeet_stream/text.py and the word rules of
server/streams/words.py): every Chinese, Japanese or Thai piece is a word, words join as the text
writes them."""

from __future__ import annotations

from types import SimpleNamespace

from parakeet_stream.server.streams.words import Pieces, _group
from parakeet_stream.text import join_words, unspaced, width


def test_which_scripts_are_written_without_spaces():
    assert all(unspaced(ch) for ch in "東京とカタカナสวัสดี")
    assert not any(unspaced(ch) for ch in "hello Zoë Ünal مرحبا שלום привет 한국어")  # Korean uses spaces


def test_words_join_with_spaces_except_between_two_unspaced_ones():
    assert join_words(["今日", "は", "GPU", "が", "速い"]) == "今日は GPU が速い"
    assert join_words(["the", "new", "plan"]) == "the new plan"
    assert join_words([]) == "" and width("東京 ab") == 7


def test_every_piece_of_an_unspaced_script_starts_a_word():
    pieces = ["<unk>", "\u2581the", "re", "\u2581東", "京", "は", "\u2581gp", "u", "ไทย"]
    tokenizer = SimpleNamespace(vocab_size=len(pieces), piece=pieces.__getitem__, special_ids=frozenset({0}),
                                eou_id=None, decode=lambda ids: "".join(pieces[i] for i in ids))
    rules = Pieces(tokenizer)
    groups = _group(rules, [(i, 0.08 * k, 0.9) for k, i in enumerate([1, 2, 3, 4, 5, 6, 7, 8])])
    assert [[token for token, _, _ in g] for g in groups] == [[1, 2], [3], [4], [5], [6, 7], [8]]

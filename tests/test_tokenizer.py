import random

import pytest
import sentencepiece as spm

from parakeet_stream.model.tokenizer import IncrementalDetokenizer, Tokenizer

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a café with naïve art and 日本 tea",
    "streaming speech recognition returns words while you speak",
    "hello world this is a tiny tokenizer for tests",
    "numbers like 12 and 345 and punctuation, too!",
    "she sells sea shells by the sea shore",
] * 20

SENTENCES = [
    "hello world",
    "café naïve 日本",
    "  leading and   inner spaces ",
    "unseen characters: € Ω 😀 ñ 中文",
    "the quick brown fox",
    "",
]

# Normalizer variants select sentencepiece's three leading-space rules.
VARIANTS = {
    "unigram": dict(model_type="unigram"),
    "bpe-keep-spaces": dict(model_type="bpe", remove_extra_whitespaces=False),
    "no-dummy-prefix": dict(
        model_type="unigram", remove_extra_whitespaces=False, add_dummy_prefix=False
    ),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def model_path(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(CORPUS), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp / "m"),
        vocab_size=340,
        hard_vocab_limit=False,
        byte_fallback=True,
        character_coverage=0.98,
        user_defined_symbols=["<EOU>", "<EOB>"],
        num_threads=1,
        minloglevel=2,
        **VARIANTS[request.param],
    )
    return tmp / "m.model"


@pytest.fixture(scope="module")
def tok(model_path):
    return Tokenizer(model_path)


@pytest.fixture(scope="module")
def sp(model_path):
    return spm.SentencePieceProcessor(model_file=str(model_path))


def reference(sp, tok, ids):
    """sentencepiece's own decode, special tokens and blanks removed."""
    return sp.decode([i for i in ids if i not in tok.special_ids and i != tok.blank_id])


def stream(tok, ids, rng):
    """Push `ids` in random chunks; return the concatenated deltas and the detokenizer."""
    detok = IncrementalDetokenizer(tok)
    cuts = sorted(rng.sample(range(len(ids) + 1), k=min(len(ids) + 1, rng.randint(0, 6))))
    bounds = [0, *cuts, len(ids)]
    deltas = [detok.push(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    return "".join(deltas) + detok.flush(), detok


def byte_ids(sp, data):
    return [sp.piece_to_id(f"<0x{b:02X}>") for b in data]


def test_ids(tok, sp):
    assert tok.vocab_size == sp.get_piece_size()
    assert tok.blank_id == tok.vocab_size
    assert tok.eou_id == sp.piece_to_id("<EOU>")
    assert tok.piece(tok.eou_id) == "<EOU>"
    assert tok.piece(tok.blank_id) == "<blank>"
    assert {tok.eou_id, sp.piece_to_id("<EOB>"), sp.bos_id(), sp.eos_id()} == set(tok.special_ids)


def test_no_eou_piece(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "m"), vocab_size=60,
        hard_vocab_limit=False, num_threads=1, minloglevel=2,
    )
    assert Tokenizer(tmp_path / "m.model").eou_id is None


def test_encode_decode_round_trip(tok):
    for text in ["hello world", "café naïve 日本", "unseen € 😀"]:
        assert tok.decode(tok.encode(text)) == text


def test_special_ids_produce_no_text(tok):
    detok = IncrementalDetokenizer(tok)
    for special in [*tok.special_ids, tok.blank_id]:
        assert detok.push([special]) == ""
    hello = tok.encode("hello world")
    assert detok.push([tok.eou_id, *hello, tok.eou_id, tok.blank_id]) == tok.decode(hello)
    assert "<EOU>" not in detok.text


def test_no_leading_space(tok, sp):
    detok = IncrementalDetokenizer(tok)
    first = detok.push(tok.encode("hello"))
    second = detok.push(tok.encode("world"))
    assert (first + second) == sp.decode(tok.encode("hello") + tok.encode("world"))
    assert not first.startswith(" ")


def test_lone_word_markers_at_start(tok, sp):
    """Whether a second leading '▁' is dropped depends on the normalizer spec."""
    ws = sp.piece_to_id("\u2581")
    ids = [ws, tok.eou_id, ws, *tok.encode("hi"), ws]
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.push([i]) for i in ids) == reference(sp, tok, ids)


def test_sentences_in_any_chunks(tok, sp):
    rng = random.Random(0)
    for text in SENTENCES:
        ids = tok.encode(text)
        for _ in range(20):
            out, detok = stream(tok, ids, rng)
            assert out == sp.decode(ids) == detok.text


def test_random_ids_in_any_chunks(tok, sp):
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.randint(0, tok.blank_id) for _ in range(rng.randint(0, 30))]
        out, detok = stream(tok, ids, rng)
        assert out == reference(sp, tok, ids) == detok.text


def test_byte_runs_in_any_chunks(tok, sp):
    """Valid and broken UTF-8 spread over byte pieces, mixed with words and specials."""
    rng = random.Random(2)
    words = tok.encode("the fox")
    noise = [tok.eou_id, tok.blank_id, *words]
    for _ in range(300):
        ids = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            if kind < 0.4:
                data = rng.choice("€😀ñ中Ω").encode()
            elif kind < 0.6:
                data = rng.choice("€😀中").encode()[: rng.randint(1, 3)]
            elif kind < 0.8:
                data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
            else:
                ids.append(rng.choice(noise))
                continue
            ids += byte_ids(sp, data)
        out, detok = stream(tok, ids, rng)
        assert out == reference(sp, tok, ids) == detok.text


def test_bytes_wait_for_a_complete_character(tok, sp):
    detok = IncrementalDetokenizer(tok)
    euro = byte_ids(sp, "€".encode())
    assert detok.push(euro[:1]) == ""
    assert detok.push(euro[1:2]) == ""
    assert detok.push(euro[2:]) == "€"
    assert detok.flush() == ""


def test_incomplete_bytes_flush_as_replacement(tok, sp):
    detok = IncrementalDetokenizer(tok)
    assert detok.push(byte_ids(sp, "€".encode()[:2])) == ""
    assert detok.flush() == "\ufffd\ufffd"


def test_bad_ids_rejected(tok):
    detok = IncrementalDetokenizer(tok)
    for bad in (-1, tok.blank_id + 1):
        with pytest.raises(ValueError):
            detok.push([bad])
        with pytest.raises(ValueError):
            tok.decode([bad])

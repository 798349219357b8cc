#!/usr/bin/env python3
"""Train the demo model's sentencepiece BPE tokenizer.

    python -m demo_model.tokenizer            # -> data/demo/tokenizer.model

Trained on the text of the ``train`` split only (``data/demo/train.jsonl``,
or ``data/demo/text/train.txt`` before the audio exists).  Layout, as in
NVIDIA's parakeet EOU model (whose tokenizer ends with ``<EOU>`` and ``<EOB>``
user-defined pieces):

* ids ``0 .. vocab_size-1``: ``<unk>`` (id 0) and the BPE pieces
  (``--vocab-size``, default 256, counts ``<unk>``);
* id ``vocab_size``: ``<EOU>`` (end of utterance), USER_DEFINED;
* id ``vocab_size + 1``: ``<EOB>`` (end of backchannel; kept for structural
  parity, unused by the demo data), USER_DEFINED.

No BOS/EOS/PAD pieces.  The RNN-T blank is NOT in the tokenizer: the model
adds it after the last piece (blank id = ``get_piece_size()``).

The script checks that encode/decode round-trips every test sentence and that
the two special pieces encode to single ids.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import sentencepiece as spm

SPECIALS = ["<EOU>", "<EOB>"]


def read_texts(data: Path, split: str) -> list[str]:
    manifest = data / f"{split}.jsonl"
    if manifest.exists():
        return [json.loads(ln)["text"] for ln in manifest.open() if ln.strip()]
    txt = data / "text" / f"{split}.txt"
    if txt.exists():
        return [ln.strip() for ln in txt.open() if ln.strip()]
    sys.exit(f"no {manifest} or {txt}: run python -m demo_model.data first")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def append_user_defined(model_bytes: bytes, pieces: list[str]) -> bytes:
    """Append USER_DEFINED pieces at the END of the vocabulary.

    (sentencepiece's ``user_defined_symbols`` option would place them right
    after the control symbols, i.e. at ids 1, 2, ...)  Edits the serialized
    ModelProto directly (no protobuf package needed): a new
    ``SentencePiece{piece, score=0, type=USER_DEFINED}`` record (field 1) is
    inserted after the last existing one.
    """
    i, end_of_pieces = 0, None
    while i < len(model_bytes):
        tag, j = _read_varint(model_bytes, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            _, j = _read_varint(model_bytes, j)
        elif wire == 1:
            j += 8
        elif wire == 2:
            n, j = _read_varint(model_bytes, j)
            j += n
        elif wire == 5:
            j += 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
        if field == 1:
            end_of_pieces = j
        i = j
    if end_of_pieces is None:
        raise ValueError("no pieces in the model")
    records = b""
    for piece in pieces:
        text = piece.encode()
        body = (b"\x0a" + _varint(len(text)) + text  # 1: piece
                + b"\x15" + b"\x00\x00\x00\x00"  # 2: score 0.0 (float)
                + b"\x18" + _varint(4))  # 3: type USER_DEFINED
        records += b"\x0a" + _varint(len(body)) + body
    return model_bytes[:end_of_pieces] + records + model_bytes[end_of_pieces:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/demo", help="corpus directory (default data/demo)")
    ap.add_argument("--out", default=None, help="output model (default <data>/tokenizer.model)")
    ap.add_argument("--vocab-size", type=int, default=256,
                    help="BPE vocabulary incl. <unk>, before <EOU>/<EOB> (default 256)")
    args = ap.parse_args(argv)

    data = Path(args.data)
    out = Path(args.out) if args.out else data / "tokenizer.model"
    train = read_texts(data, "train")
    print(f"training BPE {args.vocab_size} on {len(train)} train sentences", flush=True)

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train),
        model_writer=buf,
        model_type="bpe",
        vocab_size=args.vocab_size,
        character_coverage=1.0,
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        split_digits=True,
        input_sentence_size=0,
        num_threads=1,
        minloglevel=2,
    )
    model = append_user_defined(buf.getvalue(), SPECIALS)
    sp = spm.SentencePieceProcessor(model_proto=model)

    # --- checks ---
    n = sp.get_piece_size()
    assert n == args.vocab_size + len(SPECIALS), n
    for k, piece in enumerate(SPECIALS):
        sid = args.vocab_size + k
        assert sp.piece_to_id(piece) == sid and sp.id_to_piece(sid) == piece, piece
        ids = sp.encode(piece)
        assert ids[-1] == sid and len(ids) <= 2, (piece, sp.encode(piece, out_type=str))
        assert sp.decode(sp.encode("hello " + piece)) == "hello " + piece
    failures = 0
    total_tokens = total_words = 0
    for split in ("test_sentences", "test_voices", "train"):
        texts = read_texts(data, split)
        if split == "train":
            texts = texts[:2000]
        for t in texts:
            ids = sp.encode(t)
            total_tokens += len(ids)
            total_words += len(t.split())
            if sp.decode(ids) != t or 0 in ids:
                failures += 1
                if failures <= 5:
                    print(f"  round-trip failed: {t!r} -> {sp.encode(t, out_type=str)}")
    if failures:
        sys.exit(f"{failures} sentences did not round-trip")
    ex = read_texts(data, "test_sentences")[0]
    print(f"example: {ex!r} -> {sp.encode(ex, out_type=str)}")
    print(f"{n} pieces (<unk>=0, BPE 1..{args.vocab_size - 1}, <EOU>={args.vocab_size}, "
          f"<EOB>={args.vocab_size + 1}); blank for the model = {n}")
    print(f"round-trip OK on all test sentences (+2000 train); "
          f"{total_tokens / total_words:.2f} tokens/word")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(model)
    tmp.replace(out)
    # human-readable vocabulary next to it
    out.with_suffix(".vocab").write_text(
        "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):.4f}\n" for i in range(n)))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

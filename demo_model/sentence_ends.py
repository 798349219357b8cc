#!/usr/bin/env python3
"""Count where written English sentences end, for the turn-taking's pauses (parakeet_stream/sentence_ends.py).

    python -m demo_model.sentence_ends             # -> parakeet_stream/data/sentence_ends.json.gz
    python -m demo_model.sentence_ends --evaluate  # what the shipped table holds on held-out sentences

The sentences of Debian's `fortunes` files (apt-get install -y fortunes), read and normalised as the
demo corpus reads them (demo_model/data.py: lower-case words, digits spelled out), each distinct one
once, less every sentence the project evaluates on: tests/fixtures/demo_sentences.json and the demo
corpus's test sets (their text is rebuilt with the corpus's own command when data/demo/text lacks it).
For each context of one to three last words (sentence starts padded) seen at least MIN_COUNT times:
how many times a sentence ended right after it, and how many times it was seen.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

from demo_model.data import fortune_files, normalize, read_fortunes
from parakeet_stream.sentence_ends import ORDER, START, TABLE, unfinished

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "demo_sentences.json"
MIN_COUNT = 3


def held_out(text_dir: Path) -> set[str]:
    """The sentences the project measures on, never counted."""
    if not (text_dir / "test_sentences.txt").is_file():
        subprocess.run([sys.executable, "-m", "demo_model.data", "--out", str(text_dir.parent), "--text-only"],
                       cwd=ROOT, check=True)
    fixture = json.loads(FIXTURE.read_text())
    held = {item["text"] for name in ("seen_voices", "heldout_voices") for item in fixture[name]}
    for name in ("test_sentences", "test_voices"):
        held |= {line.strip() for line in (text_dir / f"{name}.txt").read_text().splitlines()}
    return held


def count(sentences: list[list[str]]) -> dict:
    ends, seen = collections.Counter(), collections.Counter()
    for words in sentences:
        padded = [START] * (ORDER - 1) + words
        for i in range(ORDER - 1, len(padded)):
            for n in range(1, ORDER + 1):
                context = " ".join(padded[i - n + 1 : i + 1])
                seen[context] += 1
                ends[context] += i == len(padded) - 1
    kept = {c: [ends[c], seen[c]] for c in sorted(seen) if seen[c] >= MIN_COUNT}
    return {"base": len(sentences) / sum(map(len, sentences)), "sentences": len(sentences), "contexts": kept}


def evaluate(text_dir: Path, seed: int = 0) -> dict:
    """On the demo corpus's unseen sentences (never counted): the share of them cut after a random
    word (a hesitation) that the turn-taking holds, and the share of their whole ends it holds."""
    rng = random.Random(seed)
    sentences = [line.split() for line in (text_dir / "test_sentences.txt").read_text().splitlines()]
    sentences = [words for words in sentences if len(words) > 1]
    cuts = [" ".join(words[: rng.randint(1, len(words) - 1)]) for words in sentences]
    return {"sentences": len(sentences), "cuts_held": round(sum(map(unfinished, cuts)) / len(cuts), 3),
            "ends_held": round(sum(unfinished(" ".join(words)) for words in sentences) / len(sentences), 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(TABLE), help="the table (gzip JSON)")
    ap.add_argument("--text", default=str(ROOT / "data" / "demo" / "text"), help="the demo corpus's text folder")
    ap.add_argument("--evaluate", action="store_true", help="measure the shipped table instead of counting")
    args = ap.parse_args(argv)
    text, out = Path(args.text), Path(args.out)
    if text.name != "text":
        sys.exit(f"--text {args.text}: a demo corpus's text folder (<corpus>/text), e.g. data/demo/text")
    if not args.evaluate and not out.parent.is_dir():
        sys.exit(f"--out {args.out}: no folder {out.parent}")
    held = held_out(text)
    if args.evaluate:
        print(json.dumps(evaluate(text)))
        return
    distinct = {" ".join(w) for w in (normalize(s) for s in read_fortunes()) if w} - held
    table = {**count([s.split() for s in sorted(distinct)]), "fortunes": [p.name for p in fortune_files()]}
    out.write_bytes(gzip.compress(json.dumps(table, separators=(",", ":")).encode(), mtime=0))
    print(f"{args.out}: {table['sentences']} sentences, {len(table['contexts'])} contexts")


if __name__ == "__main__":
    main()

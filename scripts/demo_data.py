#!/usr/bin/env python3
"""Build the synthetic espeak-ng corpus for the parakeet-stream demo model.

One command, idempotent and resumable::

    python scripts/demo_data.py                 # -> data/demo/
    python scripts/demo_data.py --jobs 1        # gentler on a shared machine

Stages (each one is skipped when its output already exists):

1. text: sentences from the Debian ``fortunes`` files, normalised to lowercase
   words (letters and apostrophes; digits spelled out), restricted to the
   ``--vocab-size`` most common words, plus generated sentences over the same
   vocabulary (clause recombination, a trigram random walk, small templates).
   Written to ``<out>/text/``.
2. plan: one rendering per sentence with a random voice / variant / speed /
   pitch / augmentation, deterministic from ``--seed``.  ``<out>/plan.json``.
3. audio: espeak-ng at 22.05 kHz -> soxr -> 16 kHz mono 16-bit FLAC under
   ``<out>/audio/<split>/<shard>/<id>.flac`` (written atomically; existing files
   are kept, so an interrupted run resumes where it stopped).
4. manifests: ``<out>/<split>.jsonl``, one JSON object per line::

       {"id": "train_000123", "audio_filepath": "audio/train/000/train_000123.flac",
        "text": "a bird in the hand", "duration": 2.41, "split": "train",
        "voice": "en-gb-scotland", "variant": "m3", "speed": 171, "pitch": 44,
        "gain_db": -7.3, "noise": "pink", "snr_db": 31.2,
        "lead_s": 0.21, "tail_s": 0.08, "source": "natural"}

   ``audio_filepath`` is relative to the directory holding the manifest.
   ``<out>/corpus.json`` summarises the corpus (counts, hours, voices held out).

Splits: ``train`` (most sentences, one rendering each, seen voices),
``test_sentences`` (unseen sentences, seen voices) and ``test_voices`` (unseen
sentences, every utterance uses a voice/variant combination that never occurs
in train: the held-out accent with any variant, or any accent with a held-out
variant).

Augmentation happens HERE, at generation time, identically distributed for all
splits: random lead-in silence, extra trailing silence, a random level (peak
between -24 and -1 dBFS) and, for most utterances, light white or pink noise
(SNR 20-45 dB).  The exact values are in each manifest line.  A trainer may add
more on the fly (e.g. fresh noise, speed perturbation).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------
# Voices
# --------------------------------------------------------------------------

# espeak-ng English accents (``espeak-ng --voices=en``; the mbrola voices are
# not installed and are not used).
TRAIN_ACCENTS = [
    "en",  # British English (gmw/en)
    "en-us",
    "en-gb-scotland",
    "en-gb-x-gbclan",  # Lancaster
    "en-gb-x-rp",  # received pronunciation
    "en-029",  # Caribbean
    "en-us-nyc",
]
HELDOUT_ACCENTS = ["en-gb-x-gbcwmd"]  # West Midlands: never in train

# Voice variants (``espeak-ng --voices=variant``).  Whispering, robotic/echo and
# otherwise odd variants are left out.  "default" means no variant.
TRAIN_VARIANTS = [
    "default",
    "m1", "m2", "m3", "m5", "m6", "m7",
    "f1", "f2", "f4", "f5",
    "klatt", "klatt2", "klatt4", "klatt5", "klatt6",
    "Alex", "Andy", "aunty", "belinda", "benjamin", "boris", "david", "ed",
    "edward", "gustave", "iven", "linda", "max", "michel", "paul", "rob",
    "robert", "steph", "travis", "grandma", "grandpa", "Gene", "Mike",
    "Michael", "adam", "Jacky", "Lee", "Denis", "Nguyen", "norbert",
]
HELDOUT_VARIANTS = ["m4", "m8", "f3", "klatt3", "Annie", "quincy"]  # never in train

SPEED_RANGE = (130, 200)  # words per minute (espeak -s)
PITCH_RANGE = (30, 70)  # espeak -p (0-99)

ESPEAK_RATE = 22050
TARGET_RATE = 16000

# Augmentation (generation time)
LEAD_RANGE = (0.05, 0.30)  # s of silence before the speech
TAIL_RANGE = (0.00, 0.30)  # s of extra silence after espeak's own ~0.35 s
PEAK_DBFS_RANGE = (-24.0, -1.0)
NOISE_PROB = 0.8
SNR_RANGE = (20.0, 45.0)

SPLIT_CODES = {"train": 1, "test_sentences": 2, "test_voices": 3}

FORTUNE_DIR = Path("/usr/share/games/fortunes")
SKIP_FORTUNE_FILES = {"art", "ascii-art"}

# --------------------------------------------------------------------------
# Text normalisation
# --------------------------------------------------------------------------

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve "
         "thirteen fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
NUMBER_WORDS = set(_ONES) | set(_TENS[2:]) | {"hundred", "thousand", "oh"}


def _below_100(n: int) -> list[str]:
    if n < 20:
        return [_ONES[n]]
    t, o = divmod(n, 10)
    return [_TENS[t]] + ([_ONES[o]] if o else [])


def _below_1000(n: int) -> list[str]:
    h, r = divmod(n, 100)
    out = [_ONES[h], "hundred"] if h else []
    if r or not out:
        out += _below_100(r)
    return out


def number_to_words(n: int) -> list[str] | None:
    """Spell 0..9999 the way people say them (years read in pairs)."""
    if n < 0 or n > 9999:
        return None
    if 1100 <= n <= 1999 or 2010 <= n <= 2099:  # years
        hi, lo = divmod(n, 100)
        if lo == 0:
            return _below_100(hi) + ["hundred"]
        return _below_100(hi) + (["oh"] + _ONES[lo:lo + 1] if lo < 10 else _below_100(lo))
    th, r = divmod(n, 1000)
    out = _below_100(th) + ["thousand"] if th else []
    if r or not out:
        out += _below_1000(r)
    return out


_BAD_CHARS = re.compile(r"[@#$%&*=+<>/\\|_~^{}\[\]`]")
_WORD_OK = re.compile(r"^[a-z]+(?:'[a-z]+)*$")


def normalize(s: str) -> list[str] | None:
    """Lowercase words (letters + inner apostrophes), digits spelled out.

    Returns None when the sentence cannot be read unambiguously (symbols,
    ordinals, decimals, non-ASCII letters, single-letter abbreviations...).
    """
    s = s.replace("\u2019", "'").replace("`", "'")
    if _BAD_CHARS.search(s):
        return None
    if re.search(r"\d[.,:]\d|\d[a-z]|[a-z]\d", s, flags=re.I):
        return None  # 1.5, 10:30, 3rd, mp3 ...
    s = re.sub(r"\d+", lambda m: " " + " ".join(number_to_words(int(m.group())) or ["<bad>"]) + " ", s)
    if "<bad>" in s:
        return None
    s = s.lower()
    s = re.sub(r"[-\u2013\u2014]+", " ", s)
    s = re.sub(r"[.,!?;:\"()]+", " ", s)
    if re.search(r"[^a-z' ]", s):
        return None
    words = []
    for w in s.split():
        w = w.strip("'")
        if not w:
            continue
        if not _WORD_OK.match(w):
            return None
        if len(w) == 1 and w not in ("a", "i"):
            return None  # initials, "e g", letters spelled out
        words.append(w)
    return words or None


def read_fortunes() -> list[str]:
    """Raw sentences (with punctuation) from every fortune file."""
    listing = FORTUNE_DIR.iterdir() if FORTUNE_DIR.is_dir() else []
    files = sorted(p for p in listing
                   if p.is_file() and not p.is_symlink() and p.suffix != ".dat"
                   and p.name not in SKIP_FORTUNE_FILES)
    if not files:
        sys.exit(f"no fortune files in {FORTUNE_DIR}: apt-get install -y fortunes fortunes-min")
    sentences = []
    for p in files:
        raw = p.read_text(encoding="utf-8", errors="replace")
        for entry in re.split(r"^%\s*$", raw, flags=re.M):
            # drop attribution lines ("-- Author") and join the rest
            lines = [ln.strip() for ln in entry.split("\n") if not re.match(r"^\s*--", ln)]
            text = " ".join(ln for ln in lines if ln)
            for s in re.split(r'(?<=[.!?;:])\s+|["()\[\]]', text):
                s = s.strip()
                if s:
                    sentences.append(s)
    return sentences


# --------------------------------------------------------------------------
# Stage 1: sentences
# --------------------------------------------------------------------------

CONNECTORS = ["and", "but", "so", "because", "when", "if", "while", "although",
              "or", "and then", "until", "before", "after", "unless", "since"]

# Small everyday templates; every word is checked against the vocabulary and a
# template is dropped when one of its fixed words is missing.
TEMPLATE_LISTS = {
    "NOUN": """time day year way thing man woman child world life hand part place
        week case work home house room door car book water food money friend
        family night morning name story table phone letter road city dog cat
        tree bird fish sun moon river window garden paper music picture game
        bed chair office school job problem question answer idea mind heart head
        eye face voice word game box bag coffee tea bread cake apple ship train
        boat horse street shop party dinner lunch breakfast computer program
        machine key hat coat shoe dress island mountain sea fire light wind
        rain snow song letter gift box clock wall floor glass cup bottle
        pen teacher doctor student king queen baby girl boy brother sister
        mother father wife husband neighbor""".split(),
    "ADJ": """good new old great big small long little young right high different
        large important bad early late hard easy strong happy sad quiet loud
        cold hot warm dark bright clean dirty fast slow free full empty
        nice beautiful strange funny simple real sure ready safe busy rich
        poor tired hungry red blue green black white open short heavy light
        wrong true deep soft sweet wild wise kind""".split(),
    "VERB": """see find take make give open close read write bring buy sell
        keep help call need want like love hate watch hear fix clean carry
        cook build move start stop try leave use paint wash visit show tell
        ask follow remember forget meet""".split(),
    "PLACE": """home outside inside upstairs downstairs here there""".split(),
    "PERSON": """i you we they he she""".split(),
    "SUBJ": """i you we they""".split(),
    "DAY": """monday tuesday wednesday thursday friday saturday sunday today
        tomorrow tonight yesterday""".split(),
    "NUM": """two three four five six seven eight nine ten eleven twelve twenty
        thirty forty fifty""".split(),
    "TIME": """morning afternoon evening night""".split(),
}

TEMPLATES = [
    "the {ADJ} {NOUN} is {PLACE}",
    "the {NOUN} is {ADJ}",
    "the {NOUN} was very {ADJ}",
    "please {VERB} the {NOUN}",
    "please {VERB} the {ADJ} {NOUN}",
    "can you {VERB} the {NOUN} for me",
    "could you {VERB} my {NOUN} {DAY}",
    "{SUBJ} want to {VERB} a {ADJ} {NOUN}",
    "{SUBJ} need to {VERB} the {NOUN} {DAY}",
    "do you {VERB} the {NOUN}",
    "where is the {ADJ} {NOUN}",
    "have you seen my {NOUN}",
    "there are {NUM} {NOUN}s in the {NOUN}",
    "i will {VERB} the {NOUN} {DAY}",
    "it was a {ADJ} {TIME}",
    "we can {VERB} it {DAY} {TIME}",
    "my {NOUN} is {ADJ} and {ADJ}",
    "the {NOUN} and the {NOUN} are {ADJ}",
    "{PERSON} said the {NOUN} was too {ADJ}",
    "don't {VERB} the {NOUN}",
    "let's {VERB} a {NOUN} {DAY}",
    "what a {ADJ} {NOUN}",
    "i think the {NOUN} is {ADJ}",
    "it takes {NUM} minutes to {VERB} the {NOUN}",
    "the {NOUN} costs {NUM} dollars",
    "see you on {DAY}",
    "{PERSON} found a {ADJ} {NOUN} near the {NOUN}",
    "why is the {NOUN} so {ADJ}",
    "how many {NOUN}s do you have",
    "never {VERB} a {ADJ} {NOUN}",
]


def _span_hashes(sentences: list[list[str]]) -> set[str]:
    """Every contiguous word span (length >= 3) of every sentence."""
    spans = set()
    for ws in sentences:
        n = len(ws)
        for i in range(n):
            for j in range(i + 3, n + 1):
                spans.add(" ".join(ws[i:j]))
    return spans


def build_sentences(args, text_dir: Path) -> dict:
    rng = random.Random(args.seed)
    raw = read_fortunes()
    normed = [normalize(s) for s in raw]
    counts = collections.Counter(w for ws in normed if ws for w in ws)
    vocab = {w for w, _ in counts.most_common(args.vocab_size)} | NUMBER_WORDS

    def in_vocab(ws):
        return all(w in vocab for w in ws)

    lo, hi = args.min_words, args.max_words
    natural = sorted({" ".join(ws) for ws in normed if ws and lo <= len(ws) <= hi and in_vocab(ws)})
    rng.shuffle(natural)
    n_test = args.n_test
    # Test sentences: natural sentences of at least 4 words.
    test_pool = [s for s in natural if len(s.split()) >= 4]
    test_sentences = test_pool[:n_test]
    test_voices = test_pool[n_test:2 * n_test]
    held = set(test_sentences) | set(test_voices)
    train_natural = [s for s in natural if s not in held]
    print(f"[text] {len(raw)} raw fortune sentences, {len(counts)} word types, "
          f"vocab {len(vocab)}, {len(natural)} natural in-vocab sentences "
          f"({len(train_natural)} for train)", flush=True)

    train = list(train_natural)
    origin = {t: "natural" for t in train}
    seen = set(train) | held
    sources = collections.Counter({"natural": len(train)})
    remaining = max(0, args.train_sentences - len(train))
    quota = {"clause": int(remaining * 0.40), "markov": int(remaining * 0.40)}
    quota["template"] = remaining - quota["clause"] - quota["markov"]

    def add(ws, src):
        if not (lo <= len(ws) <= hi) or not in_vocab(ws):
            return False
        s = " ".join(ws)
        if s in seen:
            return False
        seen.add(s)
        train.append(s)
        origin[s] = src
        sources[src] += 1
        return True

    # --- clause recombination (train sources only) ---
    clauses = set()
    for s in raw:
        ws_full = normalize(s)
        if not ws_full or " ".join(ws_full) in held:
            continue
        for piece in re.split(r"[,;:]\s+|\s+-+\s+", s):
            ws = normalize(piece)
            if ws and 3 <= len(ws) <= 10 and in_vocab(ws):
                if ws[0] in ("and", "but", "so", "or", "because"):
                    ws = ws[1:]
                if len(ws) >= 3:
                    clauses.add(tuple(ws))
    clauses = sorted(clauses)
    rng.shuffle(clauses)
    tries = 0
    while sources["clause"] < quota["clause"] and clauses and tries < quota["clause"] * 50:
        tries += 1
        a, b = rng.choice(clauses), rng.choice(clauses)
        if a == b:
            continue
        conn = rng.choice(CONNECTORS).split()
        add(list(a) + conn + list(b), "clause")
    print(f"[text] {len(clauses)} clauses -> {sources['clause']} recombined sentences", flush=True)

    # --- trigram random walk over the train sentences ---
    corpus = [s.split() for s in train_natural]
    copies = _span_hashes(corpus) | set(held)
    nxt = collections.defaultdict(list)
    for ws in corpus:
        seq = ["<s>", "<s>"] + ws + ["</s>"]
        for i in range(2, len(seq)):
            nxt[(seq[i - 2], seq[i - 1])].append(seq[i])
    tries = 0
    while sources["markov"] < quota["markov"] and tries < quota["markov"] * 50:
        tries += 1
        ctx, ws = ("<s>", "<s>"), []
        while len(ws) <= hi:
            w = rng.choice(nxt[ctx])
            if w == "</s>":
                break
            ws.append(w)
            ctx = (ctx[1], w)
        if len(ws) < max(lo, 4) or len(ws) > hi:
            continue
        if " ".join(ws) in copies:  # verbatim piece of a real sentence
            continue
        add(ws, "markov")
    print(f"[text] {sources['markov']} trigram-walk sentences", flush=True)

    # --- templates ---
    lists = {k: [w for w in v if w in vocab] for k, v in TEMPLATE_LISTS.items()}
    plural_ok = {w for w in lists["NOUN"] if w + "s" in vocab}
    usable = []
    for t in TEMPLATES:
        fixed = [w for w in re.sub(r"\{[A-Z]+\}s?", " ", t).split()]
        if all(w in vocab for w in fixed):
            usable.append(t)
    tries = 0
    while sources["template"] < quota["template"] and usable and tries < quota["template"] * 100:
        tries += 1
        t = rng.choice(usable)

        def fill(m):
            key, plural = m.group(1), m.group(2)
            if plural:
                return rng.choice(sorted(plural_ok)) + "s"
            return rng.choice(lists[key])

        s = re.sub(r"\{([A-Z]+)\}(s?)", fill, t)
        add(s.split(), "template")
    print(f"[text] {sources['template']} template sentences from {len(usable)} templates", flush=True)

    rng.shuffle(train)
    text_dir.mkdir(parents=True, exist_ok=True)
    for name, sents in (("train", train), ("test_sentences", test_sentences),
                        ("test_voices", test_voices)):
        (text_dir / f"{name}.txt").write_text("".join(s + "\n" for s in sents))
    (text_dir / "train_sources.txt").write_text("".join(origin[s] + "\n" for s in train))
    (text_dir / "vocab.txt").write_text("".join(w + "\n" for w in sorted(vocab)))
    info = {"sources": dict(sources), "vocab_size": len(vocab),
            "natural_in_vocab": len(natural), "clauses": len(clauses),
            "fortune_sentences": len(raw)}
    (text_dir / "info.json").write_text(json.dumps(info, indent=1))  # written last = done marker
    return info


# --------------------------------------------------------------------------
# Stage 2: plan
# --------------------------------------------------------------------------

def plan_split(split: str, sentences: list[str], sources: dict, seed: int,
               augment: bool) -> list[dict]:
    rng = random.Random(seed * 1000 + SPLIT_CODES[split])
    if split == "test_voices":
        combos = ([(a, v) for a in HELDOUT_ACCENTS for v in TRAIN_VARIANTS + HELDOUT_VARIANTS]
                  + [(a, v) for a in TRAIN_ACCENTS for v in HELDOUT_VARIANTS])
    else:
        combos = [(a, v) for a in TRAIN_ACCENTS for v in TRAIN_VARIANTS]
    items = []
    for i, text in enumerate(sentences):
        accent, variant = rng.choice(combos)
        uid = f"{split}_{i:06d}"
        it = {
            "id": uid,
            "audio_filepath": f"audio/{split}/{i // 1000:03d}/{uid}.flac",
            "text": text,
            "split": split,
            "voice": accent,
            "variant": variant,
            "speed": rng.randint(*SPEED_RANGE),
            "pitch": rng.randint(*PITCH_RANGE),
        }
        if augment:
            noise = rng.choice(["white", "pink"]) if rng.random() < NOISE_PROB else "none"
            it.update({
                "gain_db": round(rng.uniform(*PEAK_DBFS_RANGE), 2),
                "noise": noise,
                "snr_db": round(rng.uniform(*SNR_RANGE), 2) if noise != "none" else None,
                "lead_s": round(rng.uniform(*LEAD_RANGE), 3),
                "tail_s": round(rng.uniform(*TAIL_RANGE), 3),
            })
        else:
            it.update({"gain_db": None, "noise": "none", "snr_db": None, "lead_s": 0.0, "tail_s": 0.0})
        it["source"] = sources.get(text, "natural")
        it["seed"] = seed * 1000 + SPLIT_CODES[split]  # per-utterance noise seed base
        items.append(it)
    return items


# --------------------------------------------------------------------------
# Stage 3: audio
# --------------------------------------------------------------------------

def espeak_samples(text: str, accent: str, variant: str, speed: int, pitch: int) -> np.ndarray:
    voice = accent if variant == "default" else f"{accent}+{variant}"
    out = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch),
                          "--stdout", text], capture_output=True, check=True).stdout
    # espeak-ng writes a streaming WAV header with bogus sizes: find "data".
    k = out.find(b"data")
    if out[:4] != b"RIFF" or k < 0:
        raise RuntimeError(f"espeak-ng gave no WAV for {voice!r}: {text!r}")
    rate = int.from_bytes(out[24:28], "little")
    if rate != ESPEAK_RATE:
        raise RuntimeError(f"unexpected espeak rate {rate}")
    pcm = out[k + 8:]
    pcm = pcm[: len(pcm) // 2 * 2]
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def _pink(n: int, rng: np.random.Generator) -> np.ndarray:
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(len(spec), dtype=np.float64)
    f[0] = 1.0
    x = np.fft.irfft(spec / np.sqrt(f), n)
    return x / (x.std() + 1e-12)


def render_one(it: dict, root: str) -> tuple[str, int]:
    """Render one utterance (skipped when its file exists); returns (id, n_samples)."""
    import soundfile as sf
    import soxr

    path = os.path.join(root, it["audio_filepath"])
    if os.path.exists(path):  # files are written to .tmp and renamed: complete
        try:
            return it["id"], sf.info(path).frames
        except Exception:
            os.remove(path)  # unreadable: render again
    x = espeak_samples(it["text"], it["voice"], it["variant"], it["speed"], it["pitch"])
    y = soxr.resample(x, ESPEAK_RATE, TARGET_RATE, quality="HQ").astype(np.float64)
    num = int(it["id"].rsplit("_", 1)[1])
    rng = np.random.default_rng([it["seed"], num])
    lead = np.zeros(int(round(it["lead_s"] * TARGET_RATE)))
    tail = np.zeros(int(round(it["tail_s"] * TARGET_RATE)))
    speech_power = float(np.mean(y[np.abs(y) > 0.01] ** 2)) if np.any(np.abs(y) > 0.01) else 1e-6
    y = np.concatenate([lead, y, tail])
    if it["noise"] != "none":
        n = rng.standard_normal(len(y)) if it["noise"] == "white" else _pink(len(y), rng)
        y = y + n * math.sqrt(speech_power / 10 ** (it["snr_db"] / 10))
    if it["gain_db"] is not None:
        y = y * (10 ** (it["gain_db"] / 20) / max(np.abs(y).max(), 1e-9))
    # +-0.5 LSB dither: no exact digital silence, even without noise
    y16 = np.clip(np.round(y * 32767 + rng.uniform(-0.5, 0.5, len(y))), -32768, 32767).astype(np.int16)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    sf.write(tmp, y16, TARGET_RATE, format="FLAC", subtype="PCM_16")
    os.replace(tmp, path)
    return it["id"], len(y16)


def _worker(args):
    it, root = args
    try:
        return render_one(it, root)
    except Exception as e:  # report, don't kill the pool
        return it["id"], f"ERROR {type(e).__name__}: {e}"


def _init_worker():
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        os.nice(5)
    except OSError:
        pass


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/demo", help="output directory (default data/demo)")
    ap.add_argument("--jobs", type=int, default=2, help="espeak-ng worker processes (default 2)")
    ap.add_argument("--train-sentences", type=int, default=45000,
                    help="target number of distinct train sentences (default 45000)")
    ap.add_argument("--n-test", type=int, default=300, help="sentences per test split (default 300)")
    ap.add_argument("--vocab-size", type=int, default=3000,
                    help="most common fortune words kept (default 3000; + number words)")
    ap.add_argument("--min-words", type=int, default=3)
    ap.add_argument("--max-words", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-augment", action="store_true", help="clean audio (no pad/gain/noise)")
    ap.add_argument("--text-only", action="store_true", help="stop after the text stage")
    ap.add_argument("--limit", type=int, default=0, help="render only the first N per split (testing)")
    ap.add_argument("--force", action="store_true", help="delete <out> and start over")
    args = ap.parse_args(argv)

    if shutil.which("espeak-ng") is None and not args.text_only:
        sys.exit("espeak-ng not found: apt-get install -y espeak-ng")

    out = Path(args.out)
    if args.force and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(args, k) for k in ("train_sentences", "n_test", "vocab_size",
                                            "min_words", "max_words", "seed", "no_augment")}
    config["voices"] = {"train_accents": TRAIN_ACCENTS, "heldout_accents": HELDOUT_ACCENTS,
                        "train_variants": TRAIN_VARIANTS, "heldout_variants": HELDOUT_VARIANTS,
                        "speed": SPEED_RANGE, "pitch": PITCH_RANGE}
    cfg_hash = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    cfg_file = out / "config.json"
    if cfg_file.exists():
        old = json.loads(cfg_file.read_text())
        if old.get("hash") != cfg_hash:
            sys.exit(f"{out} was built with a different configuration ({cfg_file}); "
                     f"use --force to rebuild or another --out")
    else:
        cfg_file.write_text(json.dumps({"hash": cfg_hash, **config}, indent=1))

    t0 = time.time()
    text_dir = out / "text"
    if not (text_dir / "info.json").exists():
        build_sentences(args, text_dir)
    else:
        print(f"[text] reusing {text_dir}", flush=True)
    splits = {name: (text_dir / f"{name}.txt").read_text().splitlines()
              for name in ("train", "test_sentences", "test_voices")}
    info = json.loads((text_dir / "info.json").read_text())
    print(f"[text] train {len(splits['train'])}, test_sentences {len(splits['test_sentences'])}, "
          f"test_voices {len(splits['test_voices'])} sentences; sources {info['sources']}", flush=True)
    if args.text_only:
        return

    # sentence origin for the manifests: natural / clause / markov / template
    sources = dict(zip(splits["train"], (text_dir / "train_sources.txt").read_text().splitlines()))

    plan_file = out / "plan.json"
    if plan_file.exists():
        plan = json.loads(plan_file.read_text())
    else:
        plan = {name: plan_split(name, sents, sources, args.seed, not args.no_augment)
                for name, sents in splits.items()}
        tmp = plan_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan))
        os.replace(tmp, plan_file)

    for name in ("test_sentences", "test_voices", "train"):
        items = plan[name][: args.limit] if args.limit else plan[name]
        frames = {}
        errors = []
        t1 = time.time()
        todo = [(it, str(out)) for it in items]
        step = max(min(100, len(todo)), len(todo) // 40)
        done_audio = 0.0
        ctx = mp.get_context("fork")
        with ctx.Pool(max(1, args.jobs), initializer=_init_worker) as pool:
            for k, (uid, res) in enumerate(pool.imap_unordered(_worker, todo, chunksize=8), 1):
                if isinstance(res, str):
                    errors.append((uid, res))
                else:
                    frames[uid] = res
                    done_audio += res / TARGET_RATE
                if k % step == 0 or k == len(todo):
                    el = time.time() - t1
                    eta = el / k * (len(todo) - k)
                    print(f"[audio:{name}] {k}/{len(todo)}  {done_audio / 3600:.2f} h  "
                          f"{el:.0f}s elapsed, eta {eta:.0f}s", flush=True)
        if errors:
            for uid, e in errors[:10]:
                print(f"  {uid}: {e}", file=sys.stderr)
            sys.exit(f"{len(errors)} utterances failed in {name}; rerun to retry")
        tmp = out / f"{name}.jsonl.tmp"
        with open(tmp, "w") as f:
            for it in items:
                rec = {k: v for k, v in it.items() if k != "seed"}
                rec["duration"] = round(frames[it["id"]] / TARGET_RATE, 4)
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, out / f"{name}.jsonl")

    # summary
    summary = {"splits": {}, "seconds_total": round(time.time() - t0, 1),
               "sample_rate": TARGET_RATE, "format": "flac PCM_16 mono",
               "train_accents": TRAIN_ACCENTS, "heldout_accents": HELDOUT_ACCENTS,
               "train_variants": TRAIN_VARIANTS, "heldout_variants": HELDOUT_VARIANTS,
               "speed_wpm": SPEED_RANGE, "pitch": PITCH_RANGE,
               "augmentation": None if args.no_augment else {
                   "where": "generation time (baked into the audio; values per manifest line)",
                   "lead_s": LEAD_RANGE, "extra_tail_s": TAIL_RANGE,
                   "peak_dbfs": PEAK_DBFS_RANGE, "noise_prob": NOISE_PROB,
                   "noise_types": ["white", "pink"], "snr_db": SNR_RANGE},
               "text": info}
    for name in ("train", "test_sentences", "test_voices"):
        recs = [json.loads(ln) for ln in open(out / f"{name}.jsonl")]
        hours = sum(r["duration"] for r in recs) / 3600
        summary["splits"][name] = {"utterances": len(recs),
                                   "sentences": len({r["text"] for r in recs}),
                                   "hours": round(hours, 3),
                                   "words": sum(len(r["text"].split()) for r in recs)}
    (out / "corpus.json").write_text(json.dumps(summary, indent=1))
    print("\n=== corpus summary ===")
    for name, s in summary["splits"].items():
        print(f"{name:15s} {s['sentences']:6d} sentences {s['utterances']:6d} utterances "
              f"{s['hours']:7.2f} h {s['words']:7d} words")
    print(f"held-out accents: {HELDOUT_ACCENTS}; held-out variants: {HELDOUT_VARIANTS}")
    print(f"augmentation: {'none' if args.no_augment else 'generation time (see manifest fields)'}")
    print(f"wrote {out}/{{train,test_sentences,test_voices}}.jsonl and corpus.json "
          f"in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Build the synthetic corpus for the parakeet-stream demo model (espeak-ng, flite, festival).

One command, idempotent and resumable::

    python -m demo_model.data                 # -> data/demo/ (espeak-ng only, as always)
    python -m demo_model.data --jobs 1        # gentler on a shared machine
    python -m demo_model.data --out data/demo_multi --synths espeak,flite,festival
    python -m demo_model.data --out data/demo_multi --vocab-size 10000 --test-text data/demo/text
                                                # same test sentences as data/demo (comparable WER)
    python -m demo_model.data --out data/demo_turns --synths espeak,flite,festival \
        --vocab-size 10000 --test-text data/demo/text --turns 4000 --train-limit 12000
                                                # + 4,000 turns with pauses inside them (no <EOU>
                                                # there), beside the first 12,000 train sentences
    python -m demo_model.data --out data/demo_turns_w --synths espeak,flite,festival \
        --vocab-size 10000 --test-text data/demo/text --turns 3000 --turn-pauses word --train-limit 6000
                                                # hesitations only (the turns whose pauses are all
                                                # between words of a sentence)

Synthesizers (``--synths``; the default ``espeak`` is the original espeak-only
corpus, whose configuration hash and plan are unchanged).  The corpus build needs
the Debian packages of every synthesizer it names::

    apt-get install -y espeak-ng                       # espeak
    apt-get install -y flite                           # flite: kal kal16 awb slt rms
    apt-get install -y festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts

These are all the offline English synthesizers Debian packages (``apt-cache search
festvox``/``flite``; ``festvox-k?lpc8k`` are 8 kHz copies of the kal/ked speakers, the
other festvox voices are not English).  A voice is ``(synth, voice, variant)``; the
wrappers and voice lists are in ``parakeet_stream/training/synth.py``.  Each utterance
draws its synthesizer with ``--synth-weights`` (espeak-ng stays a fraction), then a
voice of that synthesizer, a rate and a pitch.  Whole voices of EVERY synthesizer are
held out for test_voices: espeak-ng's West Midlands accent and six variants, flite's
rms and festival's ked_diphone never render a train or test_sentences utterance.

Stages (each one is skipped when its output already exists):

1. text: sentences from the Debian ``fortunes`` files, normalised to lowercase
   words (letters and apostrophes; digits spelled out), restricted to the
   ``--vocab-size`` most common words, plus generated sentences over the same
   vocabulary (clause recombination, a trigram random walk, small templates).
   Written to ``<out>/text/``.
2. plan: one rendering per sentence with a random synthesizer / voice / variant /
   speed / pitch / augmentation, deterministic from ``--seed``.  ``<out>/plan.json``.
   With ``--turns N`` also N turns (``turn_000000``...: one to three train sentences
   by one train voice, with 0.3-1.2 s pauses inside the turn, demo_model/turns.py),
   rendered into train after its sentences (``--turn-pauses word``: only the turns
   whose pauses are all hesitations); ``--train-limit K`` renders only the
   first K train sentences (each exactly as the full corpus renders it).
3. audio: synthesizer (espeak-ng 22.05 kHz, flite 8 or 16 kHz, festival 16 or 32
   kHz) -> soxr -> 16 kHz mono 16-bit FLAC under
   ``<out>/audio/<split>/<shard>/<id>.flac`` (written atomically; existing files
   are kept, so an interrupted run resumes where it stopped).
4. manifests: ``<out>/<split>.jsonl``, one JSON object per line::

       {"id": "train_000123", "audio_filepath": "audio/train/000/train_000123.flac",
        "text": "a bird in the hand", "duration": 2.41, "split": "train",
        "voice": "en-gb-scotland", "variant": "m3", "speed": 171, "pitch": 44,
        "gain_db": -7.3, "noise": "pink", "snr_db": 31.2,
        "lead_s": 0.21, "tail_s": 0.08, "source": "natural", "synth": "espeak",
        "reverb_rt60": null, "telephone": null}

   flite/festival lines have ``"speed": null, "pitch": null`` and instead
   ``"stretch"`` (duration factor, > 1 slower) and ``"f0_hz"`` (target mean F0; null
   where the voice's pitch cannot be set).  Manifests of plans made before
   ``--synths`` existed lack the three new fields (they mean espeak, none, none).

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
(SNR 20-45 dB).  With more than espeak-ng (or explicit ``--reverb-prob`` /
``--telephone-prob``) also: reverberation on a fraction of utterances (a synthetic
room impulse response: direct path + exponentially decaying noise, RT60 0.1-0.6 s,
``reverb_rt60``), and telephone-band copies on a fraction (8 kHz, 300-3400 Hz, half
of them through a G.711 mu-law round trip, back to 16 kHz; ``telephone`` is
``"8k"`` or ``"8k_mulaw"``).  Order: speech -> room -> silence padding -> noise ->
telephone channel -> level -> dither.  The exact values are in each manifest line.
A trainer may add more on the fly (e.g. fresh noise, speed perturbation).
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
import sys
import time
from pathlib import Path

import numpy as np

from demo_model import turns
from parakeet_stream.training import synth as synths

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

TARGET_RATE = 16000
DEFAULT_SYNTH_WEIGHTS = {"espeak": 0.4, "flite": 0.3, "festival": 0.3}

# Augmentation (generation time)
LEAD_RANGE = (0.05, 0.30)  # s of silence before the speech
TAIL_RANGE = (0.00, 0.30)  # s of extra silence after espeak's own ~0.35 s
PEAK_DBFS_RANGE = (-24.0, -1.0)
NOISE_PROB = 0.8
SNR_RANGE = (20.0, 45.0)
RT60_RANGE = (0.1, 0.6)  # s; reverberation (multi-synth corpus)
REVERB_PROB = 0.25  # default with more than espeak-ng
TELEPHONE_PROB = 0.15  # default with more than espeak-ng
MULAW_PROB = 0.5  # of the telephone copies
TELEPHONE_RATE = 8000
TELEPHONE_BAND = (300.0, 3400.0)

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


def fortune_files() -> list[Path]:
    """The fortune files read (every installed fortunes package adds its own)."""
    listing = FORTUNE_DIR.iterdir() if FORTUNE_DIR.is_dir() else []
    return sorted(p for p in listing
                  if p.is_file() and not p.is_symlink() and p.suffix != ".dat" and p.name not in SKIP_FORTUNE_FILES)


def read_fortunes() -> list[str]:
    """Raw sentences (with punctuation) from every fortune file."""
    files = fortune_files()
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
    if args.test_text:  # an earlier corpus's test sentences: comparable figures, still unseen
        test_dir = Path(args.test_text)
        test_sentences, test_voices = ((test_dir / f"{name}.txt").read_text().splitlines()
                                       for name in ("test_sentences", "test_voices"))
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

def espeak_combos(split: str) -> list[tuple[str, str]]:
    """(accent, variant) pairs: held-out ones for test_voices, train ones otherwise."""
    if split == "test_voices":
        return ([(a, v) for a in HELDOUT_ACCENTS for v in TRAIN_VARIANTS + HELDOUT_VARIANTS]
                + [(a, v) for a in TRAIN_ACCENTS for v in HELDOUT_VARIANTS])
    return [(a, v) for a in TRAIN_ACCENTS for v in TRAIN_VARIANTS]


def pick_voice(rng: random.Random, split: str, mix: dict) -> dict:
    """Synthesizer, voice, rate and pitch of one utterance (espeak-only: the original draws)."""
    names = list(mix)
    synth = names[0] if len(names) == 1 else rng.choices(names, [mix[n] for n in names])[0]
    if synth == "espeak":
        accent, variant = rng.choice(espeak_combos(split))
        return {"voice": accent, "variant": variant, "speed": rng.randint(*SPEED_RANGE),
                "pitch": rng.randint(*PITCH_RANGE), "synth": synth}
    train, held = synths.synth_voices(synth)
    voice = rng.choice(held if split == "test_voices" else train)
    f0 = synths.VOICE_F0[(synth, voice)]
    return {"voice": voice, "variant": "default", "speed": None, "pitch": None, "synth": synth,
            "stretch": round(rng.uniform(*synths.STRETCH_RANGE), 3),
            "f0_hz": rng.randint(*f0) if f0 else None}


def pick_augment(rng: random.Random, opts: dict) -> dict:
    """Level, padding and noise (original draws), then room and telephone channel."""
    if not opts["augment"]:
        return {"gain_db": None, "noise": "none", "snr_db": None, "lead_s": 0.0, "tail_s": 0.0,
                "reverb_rt60": None, "telephone": None}
    noise = rng.choice(["white", "pink"]) if rng.random() < NOISE_PROB else "none"
    it = {"gain_db": round(rng.uniform(*PEAK_DBFS_RANGE), 2), "noise": noise,
          "snr_db": round(rng.uniform(*SNR_RANGE), 2) if noise != "none" else None,
          "lead_s": round(rng.uniform(*LEAD_RANGE), 3), "tail_s": round(rng.uniform(*TAIL_RANGE), 3),
          "reverb_rt60": None, "telephone": None}
    if opts["reverb_prob"] > 0 and rng.random() < opts["reverb_prob"]:
        it["reverb_rt60"] = round(rng.uniform(*RT60_RANGE), 3)
    if opts["telephone_prob"] > 0 and rng.random() < opts["telephone_prob"]:
        it["telephone"] = "8k_mulaw" if rng.random() < MULAW_PROB else "8k"
    return it


def plan_split(split: str, sentences: list[str], sources: dict, seed: int, opts: dict) -> list[dict]:
    """One rendering per sentence; ``opts``: augment, mix {synth: weight}, reverb/telephone probs."""
    rng = random.Random(seed * 1000 + SPLIT_CODES[split])
    items = []
    for i, text in enumerate(sentences):
        uid = f"{split}_{i:06d}"
        it = {"id": uid, "audio_filepath": f"audio/{split}/{i // 1000:03d}/{uid}.flac",
              "text": text, "split": split}
        it.update(pick_voice(rng, split, opts["mix"]))
        it.update(pick_augment(rng, opts))
        it["source"] = sources.get(text, "natural")
        it["seed"] = seed * 1000 + SPLIT_CODES[split]  # per-utterance noise seed base
        items.append(it)
    return items


# --------------------------------------------------------------------------
# Stage 3: audio
# --------------------------------------------------------------------------

def _pink(n: int, rng: np.random.Generator) -> np.ndarray:
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(len(spec), dtype=np.float64)
    f[0] = 1.0
    x = np.fft.irfft(spec / np.sqrt(f), n)
    return x / (x.std() + 1e-12)


def reverberate(y: np.ndarray, rt60: float, rng: np.random.Generator) -> np.ndarray:
    """Convolve with a synthetic room: direct path + exponentially decaying noise tail.

    The tail starts 2-10 ms after the direct path, decays 60 dB in ``rt60`` seconds and
    carries a random direct-to-reverberant ratio (-2..8 dB).  The output keeps the tail.
    """
    n = int(rt60 * 1.2 * TARGET_RATE)
    t = np.arange(n) / TARGET_RATE
    tail = rng.standard_normal(n) * np.exp(-math.log(1000.0) * t / rt60)
    tail *= math.sqrt(10 ** (-rng.uniform(-2.0, 8.0) / 10) / np.sum(tail ** 2))
    h = np.zeros(n + int(rng.uniform(0.002, 0.010) * TARGET_RATE))
    h[0] = 1.0
    h[len(h) - n:] += tail
    m = len(y) + len(h) - 1
    nfft = 1 << (m - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(y, nfft) * np.fft.rfft(h, nfft), nfft)[:m]


def mulaw_roundtrip(x: np.ndarray, mu: float = 255.0) -> np.ndarray:
    """G.711 mu-law: compress, quantise to 8 bits, expand (x in [-1, 1])."""
    c = np.sign(x) * np.log1p(mu * np.minimum(np.abs(x), 1.0)) / math.log1p(mu)
    q = np.round((c + 1) / 2 * 255) / 255 * 2 - 1
    return np.sign(q) * np.expm1(np.abs(q) * math.log1p(mu)) / mu


def telephone(y: np.ndarray, mulaw: bool) -> np.ndarray:
    """Telephone channel: 8 kHz, 300-3400 Hz band, optional mu-law, back to 16 kHz."""
    import soxr

    z = soxr.resample(y, TARGET_RATE, TELEPHONE_RATE, quality="HQ")
    spec = np.fft.rfft(z)
    f = np.fft.rfftfreq(len(z), 1 / TELEPHONE_RATE)
    spec[(f < TELEPHONE_BAND[0]) | (f > TELEPHONE_BAND[1])] = 0
    z = np.fft.irfft(spec, len(z))
    if mulaw:
        scale = 0.7 / max(np.abs(z).max(), 1e-9)  # a hot but unclipped line level
        z = mulaw_roundtrip(z * scale) / scale
    return soxr.resample(z, TELEPHONE_RATE, TARGET_RATE, quality="HQ")[: len(y)]


def render_audio(it: dict) -> np.ndarray:
    """Synthesize one plan item and apply its augmentation: int16 samples at TARGET_RATE."""
    import soxr

    x, rate = turns.synthesize_turn(it) if "segments" in it else synths.synthesize(it)
    y = (x if rate == TARGET_RATE else soxr.resample(x, rate, TARGET_RATE, quality="HQ")).astype(np.float64)
    num = int(it["id"].rsplit("_", 1)[1])
    rng = np.random.default_rng([it["seed"], num])
    if it.get("reverb_rt60"):
        y = reverberate(y, it["reverb_rt60"], np.random.default_rng([it["seed"], num, 1]))
    lead = np.zeros(int(round(it["lead_s"] * TARGET_RATE)))
    tail = np.zeros(int(round(it["tail_s"] * TARGET_RATE)))
    speech_power = float(np.mean(y[np.abs(y) > 0.01] ** 2)) if np.any(np.abs(y) > 0.01) else 1e-6
    y = np.concatenate([lead, y, tail])
    if it["noise"] != "none":
        n = rng.standard_normal(len(y)) if it["noise"] == "white" else _pink(len(y), rng)
        y = y + n * math.sqrt(speech_power / 10 ** (it["snr_db"] / 10))
    if it.get("telephone"):
        y = telephone(y, it["telephone"] == "8k_mulaw")
    if it["gain_db"] is not None:
        y = y * (10 ** (it["gain_db"] / 20) / max(np.abs(y).max(), 1e-9))
    # +-0.5 LSB dither: no exact digital silence, even without noise
    return np.clip(np.round(y * 32767 + rng.uniform(-0.5, 0.5, len(y))), -32768, 32767).astype(np.int16)


def render_one(it: dict, root: str) -> tuple[str, int]:
    """Render one utterance (skipped when its file exists); returns (id, n_samples)."""
    import soundfile as sf

    path = os.path.join(root, it["audio_filepath"])
    if os.path.exists(path):  # files are written to .tmp and renamed: complete
        try:
            return it["id"], sf.info(path).frames
        except Exception:
            os.remove(path)  # unreadable: render again
    y16 = render_audio(it)
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

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/demo", help="output directory (default data/demo)")
    ap.add_argument("--jobs", type=int, default=2, help="synthesizer worker processes (default 2)")
    ap.add_argument("--train-sentences", type=int, default=45000,
                    help="target number of distinct train sentences (default 45000)")
    ap.add_argument("--n-test", type=int, default=300, help="sentences per test split (default 300)")
    ap.add_argument("--vocab-size", type=int, default=3000,
                    help="most common fortune words kept (default 3000; + number words)")
    ap.add_argument("--min-words", type=int, default=3)
    ap.add_argument("--max-words", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--synths", default="espeak",
                    help="comma-separated synthesizers among espeak,flite,festival (default espeak: "
                         "the original espeak-only corpus)")
    ap.add_argument("--synth-weights", default=",".join(f"{k}={v}" for k, v in DEFAULT_SYNTH_WEIGHTS.items()),
                    help="sampling weight per synthesizer, NAME=W,... (default %(default)s; "
                         "only the --synths ones are used)")
    ap.add_argument("--reverb-prob", type=float, default=None,
                    help=f"fraction of utterances through a synthetic room (default {REVERB_PROB} "
                         "with more than espeak, 0 with espeak only)")
    ap.add_argument("--telephone-prob", type=float, default=None,
                    help=f"fraction of telephone-band (8 kHz) copies (default {TELEPHONE_PROB} "
                         "with more than espeak, 0 with espeak only)")
    ap.add_argument("--no-augment", action="store_true",
                    help="clean audio (no pad/gain/noise/room/telephone)")
    ap.add_argument("--test-text", default=None,
                    help="take both test splits' sentences from this earlier corpus's text/ folder "
                         "(kept out of train), so that WER figures compare across corpora")
    ap.add_argument("--turns", type=int, default=0,
                    help="add N turns of 1-3 train sentences with pauses inside them (no <EOU> at a "
                         "pause) to train (default 0; see demo_model/turns.py)")
    ap.add_argument("--turn-pauses", choices=["all", "word"], default="all",
                    help="pauses inside the turns: all (hesitations between words and pauses between "
                         "sentences, default) or word (only turns whose pauses are hesitations)")
    ap.add_argument("--train-limit", type=int, default=0,
                    help="render only the first N train sentences of the plan (0: all); the plan, "
                         "and so each rendered utterance, stays the full corpus's")
    ap.add_argument("--text-only", action="store_true", help="stop after the text stage")
    ap.add_argument("--limit", type=int, default=0, help="render only the first N per split (testing)")
    ap.add_argument("--force", action="store_true", help="delete <out> and start over")
    return ap.parse_args(argv)


def synth_options(args) -> dict:
    """augment, mix {synth: weight} (normalised), reverb_prob, telephone_prob."""
    names = [n.strip() for n in args.synths.split(",") if n.strip()]
    bad = [n for n in names if n not in synths.SYNTHS]
    if not names or bad or len(set(names)) != len(names):
        sys.exit(f"--synths: expected distinct names among {','.join(synths.SYNTHS)}, got {args.synths!r}")
    weights = dict(DEFAULT_SYNTH_WEIGHTS)
    for kv in filter(None, args.synth_weights.split(",")):
        k, _, v = kv.partition("=")
        weights[k.strip()] = float(v)
    total = sum(weights.get(n, 0.0) for n in names)
    if total <= 0:
        sys.exit(f"--synth-weights: no positive weight among {names}")
    mix = {n: round(weights.get(n, 0.0) / total, 6) for n in names}
    legacy = names == ["espeak"]
    reverb = args.reverb_prob if args.reverb_prob is not None else (0.0 if legacy else REVERB_PROB)
    phone = args.telephone_prob if args.telephone_prob is not None else (0.0 if legacy else TELEPHONE_PROB)
    return {"augment": not args.no_augment, "mix": mix,
            "reverb_prob": 0.0 if args.no_augment else reverb,
            "telephone_prob": 0.0 if args.no_augment else phone}


def check_synths(opts: dict) -> None:
    for name in opts["mix"]:
        if shutil.which(synths.BINARIES[name]) is None:
            sys.exit(f"{synths.BINARIES[name]} not found: apt-get install -y {synths.PACKAGES[name]}")
    if "festival" in opts["mix"]:
        for voice in [*synths.FESTIVAL_VOICES[0], *synths.FESTIVAL_VOICES[1]]:
            if not list(Path("/usr/share/festival/voices").glob(f"*/{voice}")):
                sys.exit(f"festival voice {voice} not installed: apt-get install -y {synths.PACKAGES['festival']}")


def corpus_config(args, opts: dict) -> dict:
    """What the corpus means; the espeak-only default keeps the original keys (and hash)."""
    config = {k: getattr(args, k) for k in ("train_sentences", "n_test", "vocab_size",
                                            "min_words", "max_words", "seed", "no_augment")}
    config["voices"] = {"train_accents": TRAIN_ACCENTS, "heldout_accents": HELDOUT_ACCENTS,
                        "train_variants": TRAIN_VARIANTS, "heldout_variants": HELDOUT_VARIANTS,
                        "speed": SPEED_RANGE, "pitch": PITCH_RANGE}
    if args.test_text:
        config["test_text"] = {name: hashlib.sha1((Path(args.test_text) / f"{name}.txt").read_bytes()).hexdigest()[:12]
                               for name in ("test_sentences", "test_voices")}
    if opts["mix"] != {"espeak": 1.0} or opts["reverb_prob"] or opts["telephone_prob"]:
        config["synths"] = {
            "mix": opts["mix"], "flite_voices": synths.FLITE_VOICES,
            "festival_voices": synths.FESTIVAL_VOICES, "stretch": synths.STRETCH_RANGE,
            "f0_hz": {f"{k[0]}/{k[1]}": v for k, v in synths.VOICE_F0.items()},
            "reverb_prob": opts["reverb_prob"], "rt60_s": RT60_RANGE,
            "telephone_prob": opts["telephone_prob"], "mulaw_prob": MULAW_PROB,
            "telephone_band_hz": TELEPHONE_BAND}
    if args.turns:  # only then: the corpora made before turns keep their hash
        config["turns"] = {"n": args.turns, "sentences": turns.SENTENCES_PER_TURN,
                           "pause_s": turns.PAUSE_RANGE, "hesitation_prob": turns.HESITATION_PROB}
        if args.turn_pauses != "all":
            config["turns"]["pauses"] = args.turn_pauses
    return config


def check_config(out: Path, config: dict) -> None:
    cfg_hash = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    cfg_file = out / "config.json"
    if cfg_file.exists():
        old = json.loads(cfg_file.read_text())
        if old.get("hash") != cfg_hash:
            sys.exit(f"{out} was built with a different configuration ({cfg_file}); "
                     f"use --force to rebuild or another --out")
    else:
        cfg_file.write_text(json.dumps({"hash": cfg_hash, **config}, indent=1))


def load_plan(out: Path, splits: dict, sources: dict, seed: int, opts: dict, n_turns: int = 0,
              sentence_pauses: bool = True) -> dict:
    plan_file = out / "plan.json"
    if plan_file.exists():
        return json.loads(plan_file.read_text())
    plan = {name: plan_split(name, sents, sources, seed, opts) for name, sents in splits.items()}
    if n_turns:
        plan["turns"] = turns.plan_turns(n_turns, splits["train"], seed,
                                         lambda rng, split: pick_voice(rng, split, opts["mix"]),
                                         lambda rng: pick_augment(rng, opts), sentence_pauses)
    tmp = plan_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan))
    os.replace(tmp, plan_file)
    return plan


def render_split(name: str, items: list[dict], out: Path, jobs: int) -> None:
    """Render (or reuse) every utterance of a split, then write its manifest."""
    frames = {}
    errors = []
    t1 = time.time()
    todo = [(it, str(out)) for it in items]
    step = max(min(100, len(todo)), len(todo) // 40)
    done_audio = 0.0
    ctx = mp.get_context("fork")
    with ctx.Pool(max(1, jobs), initializer=_init_worker) as pool:
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


def voice_table(out: Path) -> dict:
    """{split: {"synth/voice": utterances}} from the manifests."""
    table = {}
    for name in ("train", "test_sentences", "test_voices"):
        recs = [json.loads(ln) for ln in (out / f"{name}.jsonl").read_text().splitlines()]
        table[name] = dict(sorted(collections.Counter(
            f"{r.get('synth', 'espeak')}/{r['voice']}" for r in recs).items()))
    return table


def write_summary(out: Path, args, opts: dict, info: dict, t0: float) -> dict:
    summary = {"splits": {}, "seconds_total": round(time.time() - t0, 1),
               "sample_rate": TARGET_RATE, "format": "flac PCM_16 mono",
               "synths": opts["mix"],
               "train_accents": TRAIN_ACCENTS, "heldout_accents": HELDOUT_ACCENTS,
               "train_variants": TRAIN_VARIANTS, "heldout_variants": HELDOUT_VARIANTS,
               "speed_wpm": SPEED_RANGE, "pitch": PITCH_RANGE,
               "augmentation": None if args.no_augment else {
                   "where": "generation time (baked into the audio; values per manifest line)",
                   "lead_s": LEAD_RANGE, "extra_tail_s": TAIL_RANGE,
                   "peak_dbfs": PEAK_DBFS_RANGE, "noise_prob": NOISE_PROB,
                   "noise_types": ["white", "pink"], "snr_db": SNR_RANGE,
                   "reverb_prob": opts["reverb_prob"], "rt60_s": RT60_RANGE,
                   "telephone_prob": opts["telephone_prob"], "mulaw_prob": MULAW_PROB},
               "text": info}
    for name in opts["mix"]:
        if name != "espeak":
            train, held = synths.synth_voices(name)
            summary[f"{name}_voices"] = {"train": train, "heldout": held}
    for name in ("train", "test_sentences", "test_voices"):
        recs = [json.loads(ln) for ln in open(out / f"{name}.jsonl")]
        hours = sum(r["duration"] for r in recs) / 3600
        summary["splits"][name] = {"utterances": len(recs),
                                   "sentences": len({r["text"] for r in recs}),
                                   "hours": round(hours, 3),
                                   "words": sum(len(r["text"].split()) for r in recs)}
    summary["voices"] = voice_table(out)
    (out / "corpus.json").write_text(json.dumps(summary, indent=1))
    return summary


def print_summary(summary: dict, out: Path, t0: float) -> None:
    print("\n=== corpus summary ===")
    for name, s in summary["splits"].items():
        print(f"{name:15s} {s['sentences']:6d} sentences {s['utterances']:6d} utterances "
              f"{s['hours']:7.2f} h {s['words']:7d} words")
    table = summary["voices"]
    if len(summary["synths"]) > 1:
        keys = sorted(set().union(*table.values()))
        print(f"\n{'synth/voice':32s} {'train':>7s} {'test_sent':>9s} {'test_voic':>9s}")
        for k in keys:
            print(f"{k:32s} " + " ".join(f"{table[n].get(k, 0):>{w}d}" for n, w in
                                        (("train", 7), ("test_sentences", 9), ("test_voices", 9))))
    print(f"synthesizers: {summary['synths']}")
    print(f"held-out accents: {HELDOUT_ACCENTS}; held-out variants: {HELDOUT_VARIANTS}"
          + "".join(f"; held-out {n} voices: {summary[f'{n}_voices']['heldout']}"
                    for n in ("flite", "festival") if f"{n}_voices" in summary))
    print(f"augmentation: {'none' if summary['augmentation'] is None else 'generation time (see manifest fields)'}")
    print(f"wrote {out}/{{train,test_sentences,test_voices}}.jsonl and corpus.json "
          f"in {time.time() - t0:.0f}s")


def main(argv=None):
    args = parse_args(argv)
    if args.test_text:
        missing = [n for n in ("test_sentences.txt", "test_voices.txt") if not (Path(args.test_text) / n).is_file()]
        if missing:
            sys.exit(f"--test-text {args.test_text}: no {' or '.join(missing)} there "
                     "(expected an earlier corpus's text/ folder)")
    opts = synth_options(args)
    if not args.text_only:
        check_synths(opts)
    out = Path(args.out)
    if args.force and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    check_config(out, corpus_config(args, opts))

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
    plan = load_plan(out, splits, sources, args.seed, opts, args.turns, args.turn_pauses == "all")
    plan["train"] = plan["train"][: args.train_limit or None] + plan.get("turns", [])
    for name in ("test_sentences", "test_voices", "train"):
        render_split(name, plan[name][: args.limit] if args.limit else plan[name], out, args.jobs)
    print_summary(write_summary(out, args, opts, info, t0), out, t0)


if __name__ == "__main__":
    main()

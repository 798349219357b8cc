"""Turns with pauses inside them, for the demo corpus (``python -m demo_model.data --turns N``).

A turn is one to three train sentences said by ONE voice, with pauses that do not end it:
a hesitation between two words of a sentence, and a pause between two sentences of the same
turn (0.3-1.2 s each).  Its manifest line has the whole turn's words as ``text``, so the
trainer's targets are the words followed by a single ``<EOU>`` at the turn's end; the pauses
are in ``segments`` (the words between pauses), ``pauses_s`` and ``pause_kinds`` ("word" or
"sentence").  The plain sentences of the corpus (and the trainer's pairs of them, with an
``<EOU>`` after each) still teach that a finished turn ends.

espeak-ng renders a turn in one pass, the pauses as SSML ``<break time="..."/>``, so the
voice and the prosody run on across them; flite and festival render each segment with the
same voice, rate and pitch, joined by silence.  The room, padding, noise, telephone band and
level of ``demo_model/data.py`` then apply to the whole turn.

Measured (``python -m benchmarks.turns --worst 39``, the bundled model fine-tuned with
``--init`` for 13-23 minutes on 6,000 corpus sentences + 3,000-4,000 turns; docs/performance.md
section 9): the false ends at the benchmark's mid-sentence pauses went from 13 of 14 to 0-1 of
14, but the model then also held back its ``<EOU>`` after the real ends (10-23 of 39 turns
ended within the 1.5 s before the next one, against 38) -- with or without the pauses between sentences, and with
``demo_model.train --end-silence 2``.  A transducer may place ``<EOU>`` anywhere in the
silence after the last word, so once some silences go on it learns to wait; the bundled
model was not replaced. ``demo_model.train --eou-window 0.24`` gives the ``<EOU>`` a place (within
0.24 s of the end of speech), ``--turn-synths espeak`` leaves out the flite and festival turns (each
of their parts is said as a whole utterance, its pitch falling at the pause) and ``--turns-from``
adds a corpus of espeak-ng turns: the ``<EOU>`` then comes 130 ms sooner, and fewer pauses end a
turn, but so do fewer ends yet (docs/performance.md section 9).
"""
from __future__ import annotations

import random

import numpy as np

from parakeet_stream.training import synth as synths

SENTENCES_PER_TURN = (1, 3)
PAUSE_RANGE = (0.3, 1.2)  # s, each pause inside a turn
HESITATION_PROB = 0.6  # a sentence of a turn gets a hesitation between two of its words
TURN_CODE = 4  # random streams: the splits use 1-3 (demo_model/data.py SPLIT_CODES)


def plan_turn(rng: random.Random, sentences: list[str]) -> dict:
    """segments, pauses_s, pause_kinds and text of one turn; at least one pause inside it."""
    picked = rng.sample(sentences, rng.randint(*SENTENCES_PER_TURN))
    hesitate = [rng.random() < HESITATION_PROB for _ in picked]
    if len(picked) == 1:
        hesitate = [True]  # a one-sentence turn is there for its hesitation
    segments, kinds = [], []
    for k, (sentence, h) in enumerate(zip(picked, hesitate)):
        words = sentence.split()
        cut = rng.randint(1, len(words) - 1) if h and len(words) > 1 else len(words)
        pieces = [words[:cut], words[cut:]] if cut < len(words) else [words]
        for j, piece in enumerate(pieces):
            if segments:
                kinds.append("sentence" if j == 0 else "word")
            segments.append(" ".join(piece))
        if k < len(picked) - 1:
            segments[-1] += "."  # a finished sentence: espeak-ng's sentence-final prosody
    pauses = [round(rng.uniform(*PAUSE_RANGE), 3) for _ in kinds]
    return {"text": " ".join(picked), "segments": segments, "pauses_s": pauses, "pause_kinds": kinds}


def plan_turns(n: int, sentences: list[str], seed: int, pick_voice, pick_augment,
               sentence_pauses: bool = True) -> list[dict]:
    """n turn items drawn from the train sentences and voices (ids turn_000000...).

    ``sentence_pauses=False`` keeps only the turns whose pauses are all hesitations (the
    others are drawn, then left out: a kept turn is the same item, id and audio either way).
    """
    rng = random.Random(seed * 1000 + TURN_CODE)
    items = []
    i = 0
    while len(items) < n:
        uid = f"turn_{i:06d}"
        it = {"id": uid, "audio_filepath": f"audio/turns/{i // 1000:03d}/{uid}.flac", "split": "train"}
        it.update(plan_turn(rng, sentences))
        it.update(pick_voice(rng, "train"))
        it.update(pick_augment(rng))
        it["source"] = "turn"
        it["seed"] = seed * 1000 + TURN_CODE
        if sentence_pauses or "sentence" not in it["pause_kinds"]:
            items.append(it)
        i += 1
    return items


def ssml(segments: list[str], pauses: list[float]) -> str:
    """espeak-ng markup: the segments with a <break> for each pause."""
    out = segments[0]
    for pause, seg in zip(pauses, segments[1:]):
        out += f' <break time="{round(pause * 1000)}ms"/> {seg}'
    return f"<speak>{out}</speak>"


def synthesize_turn(it: dict) -> tuple[np.ndarray, int]:
    """(float32 samples, rate) of one turn item, pauses included."""
    if it["synth"] == "espeak":
        return synths.espeak(ssml(it["segments"], it["pauses_s"]), it["voice"], it["variant"],
                             it["speed"], it["pitch"], markup=True)
    parts, rate = [], None
    for k, seg in enumerate(it["segments"]):
        x, rate = synths.synthesize({**it, "text": seg.rstrip(".")})
        if k:
            parts.append(np.zeros(int(round(it["pauses_s"][k - 1] * rate)), np.float32))
        parts.append(x)
    return np.concatenate(parts), rate

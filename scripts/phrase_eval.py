#!/usr/bin/env python3
"""Key-phrase boosting on the bundled demo model: recall, other words, false insertions, cost.

    python scripts/phrase_eval.py                 # the figures of docs/performance.md, "Key phrases"
    python scripts/phrase_eval.py --bonus 3.5,4,4.5,5 --no-cost   # recall etc. at these bonuses (the pick)
    python scripts/phrase_eval.py --cost-only     # only the decode cost at 0 / 10 / 100 phrases

The set (deterministic): 40 sentences with a name, a place, a drug or a product the demo model does
not know (PHRASES, each in two carrier sentences of common words, spoken by espeak-ng at test time
in the training accents), and the 40 held-out sentences of tests/fixtures/demo_sentences.json,
which hold none. Every stream of both halves boosts all of PHRASES. Measured:
- recall: sentences whose transcript holds their phrase (as whole words);
- WER on the other words: the phrase-free half's WER, and on the other half the errors on the
  words outside the phrase (its words, and insertions beside it, left out);
- false insertions: phrases in the transcripts of the phrase-free half;
- the greedy decoder's time per step at batch 16 (the streaming chunk of every stream, as the
  engine's decode stage runs them on CPU) with 0, 10 and 100 phrases per stream;
- one boosting step against one greedy iteration at batch 16, on the same inputs at every phrase
  count (so on any model, a random-weight full-size one included, unlike the passes, whose work
  changes with the labels boosting picks).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np
import torch

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.phrases import BONUS, LIMITS, Phrase, boosting_tree, check_phrases
from parakeet_stream.model.boosting import BoostPool, word_starts
from parakeet_stream.model.greedy import GreedyPass
from parakeet_stream.training.data import edit_distance

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
FIXTURE = ROOT / "tests" / "fixtures" / "demo_sentences.json"
COST_STEPS = 40  # streaming chunks per stream timed at each phrase count


def phrase_set() -> tuple[list[dict], list[dict]]:
    """(sentences with a phrase, sentences without), each a dict for test_demo_model.synth."""
    with_phrase = []
    for kind, words in PHRASES.items():
        for word in words:
            for carrier in CARRIERS[kind]:
                voice, variant, speed, pitch = VOICES[len(with_phrase) % len(VOICES)]
                with_phrase.append({"text": carrier.format(word), "phrase": word, "voice": voice,
                                    "variant": variant, "speed": speed, "pitch": pitch})
    fixture = json.loads(FIXTURE.read_text())
    return with_phrase, fixture["seen_voices"] + fixture["heldout_voices"]


def all_phrases(weight: float = 1.0) -> tuple[Phrase, ...]:
    return check_phrases([(w, weight) for words in PHRASES.values() for w in words])


def transcribe(engine: ASREngine, audios: list[np.ndarray], phrases: tuple[Phrase, ...]) -> list[str]:
    """Every audio as its own stream, 16 at a time, all boosting `phrases`."""
    from helpers import collect_until_final

    out = []
    for start in range(0, len(audios), 16):
        sids = [engine.create_stream(phrases=phrases) for _ in audios[start : start + 16]]
        for sid, audio in zip(sids, audios[start : start + 16]):
            engine.push_audio(sid, audio)
            engine.finalize(sid)
        out += ["".join(r.text for r in collect_until_final(engine, sid)).strip() for sid in sids]
    return out


def contains(hyp: str, phrase: str) -> int:
    """How often `phrase` occurs in `hyp` as whole words."""
    return f" {hyp} ".count(f" {phrase} ")


def other_word_errors(ref: str, phrase: str, hyp: str) -> tuple[int, int]:
    """(errors, words) on the words of `ref` outside `phrase`: the phrase and whatever the hypothesis
    has in its place are cut out of both sides at the phrase's position (the alignment's anchor
    words before and after it)."""
    before, _, after = f" {ref} ".partition(f" {phrase} ")
    before, after = before.split(), after.split()
    words = hyp.split()
    # the hypothesis split where the words before the phrase end and those after it start
    best = None
    for i in range(len(words) + 1):
        for j in range(i, len(words) + 1):
            e = edit_distance(before, words[:i]) + edit_distance(after, words[j:])
            if best is None or e < best:
                best = e
    return best, len(before) + len(after)


def metrics(with_items, without_items, hyps_with, hyps_without) -> dict:
    found = [contains(h, item["phrase"]) > 0 for item, h in zip(with_items, hyps_with)]
    other = [other_word_errors(item["text"], item["phrase"], h) for item, h in zip(with_items, hyps_with)]
    errors = sum(edit_distance(i["text"].split(), h.split()) for i, h in zip(without_items, hyps_without))
    words = sum(len(i["text"].split()) for i in without_items)
    words_all = [w for ws in PHRASES.values() for w in ws]
    return {"recall": round(sum(found) / len(found), 3),
            "wer_phrase_free": round(errors / words, 4),
            "wer_other_words_beside_phrases": round(sum(e for e, _ in other) / sum(n for _, n in other), 4),
            "false_insertions": sum(contains(h, p) for h in hyps_without for p in words_all),
            "missed": [i["phrase"] for i, ok in zip(with_items, found) if not ok]}


def decode_cost(engine: ASREngine, audios: list[np.ndarray], counts=(0, 10, 100), repeats: int = 30) -> dict:
    """Milliseconds per greedy pass over one streaming chunk of 16 streams, per phrase count: the
    counts' passes interleaved chunk by chunk (the machine's noise hits them alike), the best of
    `repeats` runs."""
    model = engine.model
    enc, enc_len, step = encoded(engine, audios)
    steps = min(COST_STEPS, enc.size(1) // step)
    pools = {n: loaded_pool(model, n) for n in counts}
    best = {n: float("inf") for n in counts}
    for _ in range(repeats):
        spent = dict.fromkeys(counts, 0.0)
        states = {n: model.decoder.initial_state(16) for n in counts}
        for n in counts:
            for slot in range(16):
                pools[n].node[slot] = 0
        for k in range(steps):
            chunk = enc[:, k * step : (k + 1) * step].float()
            valid = (enc_len - k * step).clamp(0, step)
            for n in counts:
                seconds, states[n] = _pass(model.decoder, chunk, valid, states[n], pools[n])
                spent[n] += seconds
        best = {n: min(best[n], spent[n] / steps) for n in counts}
    return {n: round(seconds * 1000, 3) for n, seconds in best.items()}


def step_cost(engine: ASREngine, audios: list[np.ndarray], counts=(10, 100), repeats: int = 300) -> dict:
    """Microseconds of the first greedy iteration over a streaming chunk of 16 streams (the joint over
    the chunk, the prediction network where a label is emitted), and of the boosting step where all 16 emit,
    per phrase count, with every stream at the root of its tree and with every stream two tokens into
    a phrase; best of `repeats`. The step's inputs are the same for every count (the joint at each
    stream's first frame, the model's best label that is not blank), so unlike the passes above, the
    figures do not depend on which labels boosting picks."""
    model, dec = engine.model, engine.model.decoder
    enc, enc_len, step = encoded(engine, audios)
    chunk, valid = enc[:, :step].float(), enc_len.clamp(max=step)
    state = dec.initial_state(16)
    with torch.inference_mode():
        passes = [GreedyPass(dec, chunk, valid, state) for _ in range(repeats)]
        logits = dec.joint(passes[0].f[:, :1], passes[0].g.unsqueeze(1))[:, 0]
        label, rows = logits[:, : dec.blank].argmax(1), torch.arange(16)
        out = {"greedy iteration": best_of([p.iterate_active for p in passes])}
        for n in counts:
            pool = loaded_pool(model, n)
            for where, node in (("at the root", 0), ("in a phrase", 2)):
                pool.node[:] = node
                steps = [partial(pool.rows(rows, rows.tolist()).step, logits, label, rows) for _ in range(repeats)]
                out[f"boosting step, {n} phrases, {where}"] = best_of(steps)
    return out


def best_of(calls) -> float:
    """The fastest of `calls` (each run once), in microseconds."""
    best = float("inf")
    for call in calls:
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return round(best * 1e6, 1)


def encoded(engine: ASREngine, audios: list[np.ndarray]):
    """(encoder output [16, T, D], valid frames, frames per streaming chunk) of the first 16 audios,
    in the engine's default lookahead mode."""
    model = engine.model
    mode = engine.default_lookahead
    feats = [model.features(torch.from_numpy(a))[0] for a in audios[:16]]
    lengths = torch.tensor([f.size(0) for f in feats])
    with torch.inference_mode():
        enc, enc_len = model.encoder(torch.nn.utils.rnn.pad_sequence(feats, batch_first=True), lengths, mode)
    return enc, enc_len, model.encoder.chunk_spec(mode).out_frames


def loaded_pool(model, count: int) -> BoostPool:
    """A CPU slot pool of 16 streams, each boosting `count` of cost_phrases() (its own rotation of the list)."""
    pool = BoostPool(16, LIMITS, torch.device("cpu"), word_starts(model.tokenizer, model.decoder.blank + 1))
    names = cost_phrases()
    for slot in range(16):
        pool.load(slot, boosting_tree(check_phrases(names[slot:] + names[:slot])[:count], model.tokenizer))
    return pool


def _pass(decoder, chunk, valid, state, pool: BoostPool):
    """(seconds, state after) of one greedy pass over a chunk, the boosting nodes carried in `pool`."""
    slots = torch.arange(chunk.size(0))
    with torch.inference_mode():
        started = time.perf_counter()
        boost = pool.rows(slots, slots.tolist())
        done = GreedyPass(decoder, chunk, valid, state, boost=boost).run()
        if boost is not None:
            boost.save()
        return time.perf_counter() - started, type(state)(*done.state())


def cost_phrases() -> list[str]:
    """100 distinct two-word names (10 first names x 10 family names), for the cost figures."""
    first = ["anna", "boris", "chen", "dmitri", "elena", "farid", "greta", "hiroshi", "ines", "jakob"]
    last = ["kowalski", "nguyen", "okonkwo", "papadopoulos", "rasmussen", "tchaikovsky", "gorbachev",
            "wojciechowski", "yamamoto", "zielinski"]
    return [f"{a} {b}" for b in last for a in first]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bonus", default=str(BONUS), help=f"base bonuses to try, comma-separated (default {BONUS})")
    ap.add_argument("--no-cost", action="store_true", help="skip the decode cost figures")
    ap.add_argument("--cost-only", action="store_true", help="only the decode cost figures")
    ap.add_argument("--model", default="demo", help="the model (recall figures need `demo`: the set is made for it; "
                                                    "--cost-only takes any, e.g. a random-weight `small` folder)")
    args = ap.parse_args(argv)
    from test_demo_model import synth

    torch.set_num_threads(1)
    with_items, without_items = phrase_set()
    audio_with = [synth(item, seed=k) for k, item in enumerate(with_items)]
    audio_without = [synth(item, seed=k) for k, item in enumerate(without_items)]
    report = {"sentences_with_phrases": len(with_items), "sentences_without": len(without_items),
              "phrases_per_stream": len(all_phrases())}
    with ASREngine(args.model, max_num_streams=16, threads=1) as engine:
        for bonus in [] if args.cost_only else [0.0] + [float(b) for b in args.bonus.split(",")]:
            phrases = all_phrases(bonus / BONUS) if bonus else ()
            hyps_with, hyps_without = transcribe(engine, audio_with, phrases), transcribe(engine, audio_without, phrases)
            report[f"bonus {bonus:g}"] = metrics(with_items, without_items, hyps_with, hyps_without)
            print(json.dumps({f"bonus {bonus:g}": report[f"bonus {bonus:g}"]}), flush=True)
        if not args.no_cost:
            report["decode_ms_per_step_batch16"] = decode_cost(engine, audio_with + audio_without)
            report["microseconds_batch16"] = step_cost(engine, audio_with + audio_without)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

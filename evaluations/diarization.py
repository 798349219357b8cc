#!/usr/bin/env python3
"""Who spoke each word: a diarizer's error rate and its words' speakers, streamed through the engine.

    python -m evaluations.diarization                  # the bundled diarizer; renders the held-out voices once
    python -m evaluations.diarization --diarizer sortformer --model small     # NVIDIA's (downloads them)

Two-voice conversations of voices the demo diarizer never trained on (turns with pauses, no
overlap, so that every word has one speaker), then three-voice ones, each streamed in 160 ms packets
through an engine with the demo recogniser and the diarizer, words and their speakers made as the
native protocol makes them. Prints JSON: the diarization error rate (80 ms frames, missed + false +
confused speech over all speech, the best mapping of speakers) and the share of words whose speaker
is right (speakers as the server numbers them, in the order they first spoke: no mapping), and the
diarizer's share of the engine's time.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np

from demo_model.conversations import FRAME, Conversations
from demo_model.train_diarizer import der, test_pool
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.diarizer_model import DEFAULT_LATENCY, LATENCIES
from parakeet_stream.server.streams.speakers import SpeakerTimeline
from parakeet_stream.server.streams.words import WordTracker

ROOT = Path(__file__).resolve().parent.parent
PACKET = 2560


def stream(engine: ASREngine, audio: np.ndarray) -> tuple[list[dict], np.ndarray]:
    """(words with speakers, speaker probabilities) of one conversation."""
    sid = engine.create_stream(diarize=True)
    for i in range(0, audio.size, PACKET):
        engine.push_audio(sid, audio[i : i + PACKET])
    engine.finalize(sid)
    tracker, speakers = WordTracker(engine.info), SpeakerTimeline(engine.info, engine.info.speakers)
    words, probs, final = [], [], False
    while not final:
        engine.wait_for_update(sid, timeout=1.0)
        for result in engine.collect(sid):
            speakers.add(result)
            if result.speakers is not None:
                probs.append(result.speakers)
            words += speakers.label(tracker.update(result, result.audio_seconds, close=result.is_final))
            final |= result.is_final
    return words, np.concatenate(probs) if probs else np.zeros((0, engine.info.speakers), np.float32)


def word_truth(word: dict, labels: np.ndarray) -> int | None:
    """The speaker talking at the word's middle (the nearest speech frame's, in a pause)."""
    speaking = np.flatnonzero(labels.any(1))
    if not speaking.size:
        return None
    frame = int((word["start"] + word["end"]) / 2 * 16000 / FRAME)
    frame = int(speaking[np.abs(speaking - frame).argmin()])
    return int(labels[frame].argmax())


def evaluate(engine: ASREngine, convs: Conversations, n: int, speakers: int, seed: int) -> dict:
    rng = random.Random(seed)
    errors = speech = right = words = 0.0
    for _ in range(n):
        audio, labels = convs.draw(rng, speakers=speakers, overlap=False)
        got, probs = stream(engine, audio)
        e, s = der(probs, labels)
        errors, speech = errors + e, speech + s
        for word in got:
            truth = word_truth(word, labels)
            if truth is not None:
                words += 1
                right += word["speaker"] == truth
    return {"conversations": n, "der": round(errors / max(speech, 1), 4), "words": int(words),
            "word_speaker_accuracy": round(right / max(words, 1), 4)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--diarizer", default=str(ROOT / "weights" / "demo-diarizer"))
    ap.add_argument("--pool", type=Path, default=ROOT / "results" / "diarizer",
                    help="where the held-out voices' utterances are (rendered there the first time, as the demo "
                         "diarizer's training does)")
    ap.add_argument("--conversations", type=int, default=20)
    ap.add_argument("--diarizer-latency", type=float, choices=sorted(LATENCIES), default=DEFAULT_LATENCY)
    args = ap.parse_args(argv)
    convs = Conversations(test_pool(args.pool), max_speakers=4, seconds=20.0)
    with ASREngine(args.model, diarizer=args.diarizer, diarizer_latency=args.diarizer_latency, max_num_streams=4) as engine:
        start = time.monotonic()
        out = {f"{k}_voices": evaluate(engine, convs, args.conversations, k, seed=k) for k in (2, 3)}
        totals = engine.step_totals()
        out["seconds"] = round(time.monotonic() - start, 1)
        out["stage_seconds"] = {k: round(v, 2) for k, v in totals.seconds.items()}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

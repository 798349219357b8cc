"""What speakers cost: the engine's time per chunk in each stage for streams with and without
diarization, on one engine that has a diarizer.

    python -m benchmarks.diarization                         # demo recogniser + demo diarizer, 8 streams
    python -m benchmarks.diarization --diarizer sortformer --model small --streams 32

N streams of the test fixtures' speech, each pushed at once in 160 ms packets and finalized (a
backlog: steps as wide and as deep as the Scheduler makes them), once without diarization and once
with, alternately for `--rounds`. Prints JSON: each stage's milliseconds per chunk encoded (the
diarize stage's included), and the wall time, per kind of run (results/bench_diarization.json).
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.common import RESULTS, speech
from parakeet_stream.engine import ASREngine

PACKET = 2560


def run(engine: ASREngine, audios: list, diarize: bool) -> tuple[dict[str, float], int, float]:
    """(seconds per stage, chunks, wall seconds) of every stream's whole audio."""
    before, start = engine.step_totals(), time.monotonic()
    sids = [engine.create_stream(diarize=diarize) for _ in audios]
    for sid, audio in zip(sids, audios):
        for i in range(0, audio.size, PACKET):
            engine.push_audio(sid, audio[i : i + PACKET])
        engine.finalize(sid)
    for sid in sids:
        while not any(result.is_final for result in engine.collect(sid)):
            engine.wait_for_update(sid, timeout=1.0)
    after = engine.step_totals()
    seconds = {stage: after.seconds[stage] - before.seconds.get(stage, 0.0) for stage in after.seconds}
    return seconds, after.chunks - before.chunks, time.monotonic() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--diarizer", default="demo")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per stream")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    audios = [speech(args.seconds, seed) for seed in range(args.streams)]
    totals = {kind: [{}, 0, 0.0] for kind in ("without", "with")}
    with ASREngine(args.model, diarizer=args.diarizer, max_num_streams=args.streams) as engine:
        run(engine, audios[:1], True)  # warm-up
        for _ in range(args.rounds):
            for kind in totals:
                seconds, chunks, wall = run(engine, audios, kind == "with")
                total = totals[kind]
                for stage, s in seconds.items():
                    total[0][stage] = total[0].get(stage, 0.0) + s
                total[1] += chunks
                total[2] += wall
    out = {"model": args.model, "diarizer": args.diarizer, "streams": args.streams, "seconds": args.seconds}
    for kind, (seconds, chunks, wall) in totals.items():
        out[f"{kind}_diarization"] = {"chunks": chunks, "wall_s": round(wall, 2),
                                      "ms_per_chunk": {k: round(v * 1000 / chunks, 3) for k, v in seconds.items() if v}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_diarization.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

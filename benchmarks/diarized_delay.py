"""How long diarized streams' results wait: from the packet that holds a result's last sample to the
result, streams with and without diarization side by side on one engine, in real time.

    python -m benchmarks.diarized_delay                          # the bundled diarizer, 1.04 s setting
    python -m benchmarks.diarized_delay --diarizer-latency 0.32

Four two-voice conversations of the voices the demo diarizer never trained on (rendered once into
results/diarizer, as `python -m evaluations.diarization` does), each streamed twice at once, with and
without diarization, in 160 ms packets paced in real time. Results are collected once per packet, so
a stream without diarization reads about 160 ms: the loop's own granularity. Results within a second
of a stream's end (the flush at its final) are left out. Prints JSON (results/bench_diarized_delay.json).
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from benchmarks.common import RESULTS, ROOT
from demo_model.conversations import Conversations
from demo_model.train_diarizer import test_pool
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.diarizer_model import DEFAULT_LATENCY, LATENCIES

PACKET = 2560  # 160 ms
RATE = 16000


def stream_all(engine: ASREngine, audios: list[np.ndarray]) -> dict[bool, list[float]]:
    """Seconds from each result's last packet to the result, by whether its stream was diarized."""
    streams = [(engine.create_stream(diarize=d), a, d) for a in audios for d in (True, False)]
    pushed = {sid: ([], []) for sid, _, _ in streams}  # (audio seconds through the packet, wall time)
    got = {sid: [] for sid, _, _ in streams}
    start = time.monotonic()
    for k, i in enumerate(range(0, max(a.size for a in audios), PACKET)):
        time.sleep(max(0.0, start + k * PACKET / RATE - time.monotonic()))
        now = time.monotonic()
        for sid, audio, _ in streams:
            if i < audio.size:
                engine.push_audio(sid, audio[i : i + PACKET])
                pushed[sid][0].append((i + PACKET) / RATE)
                pushed[sid][1].append(now)
        for sid, _, _ in streams:
            got[sid] += [(r, time.monotonic()) for r in engine.collect(sid)]
    waits = {True: [], False: []}
    for sid, audio, diarized in streams:
        ends, times = (np.array(column) for column in pushed[sid])
        for result, at in got[sid]:
            if result.audio_seconds < audio.size / RATE - 1:
                waits[diarized].append(at - times[np.searchsorted(ends, result.audio_seconds - 1e-6)])
        engine.cancel(sid)
    return waits


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--diarizer", default=str(ROOT / "weights" / "demo-diarizer"))
    ap.add_argument("--diarizer-latency", type=float, choices=sorted(LATENCIES), default=DEFAULT_LATENCY)
    ap.add_argument("--conversations", type=int, default=4)
    args = ap.parse_args(argv)
    convs = Conversations(test_pool(ROOT / "results" / "diarizer"), max_speakers=4, seconds=20.0)
    rng = random.Random(2)
    audios = [convs.draw(rng, 2, overlap=False)[0] for _ in range(args.conversations)]
    with ASREngine("demo", diarizer=args.diarizer, diarizer_latency=args.diarizer_latency,
                   max_num_streams=2 * args.conversations) as engine:
        waits = stream_all(engine, audios)
    out = {"diarizer_latency": args.diarizer_latency}
    for diarized, name in ((False, "without"), (True, "with")):
        ms = np.array(waits[diarized]) * 1000
        out[name] = {"results": int(ms.size), "mean_ms": round(float(ms.mean())), "p50_ms": round(float(np.median(ms))),
                     "p95_ms": round(float(np.percentile(ms, 95)))}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_diarized_delay.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""End-of-turn latency and false ends on Deepgram Flux's `/v2/listen`, on the bundled demo model.

    python -m benchmarks.turns                   # results/bench_turns.json and a table
    python -m benchmarks.turns --eager 0.5 --concurrency 4
    python -m benchmarks.turns --model small     # NVIDIA's parakeet_realtime_eou_120m (downloads it)
    python -m benchmarks.turns --worst 10        # and the 10 slowest EndOfTurns, to read a tail off a run

The recordings (deterministic): the 40 held-out sentences of tests/fixtures/demo_sentences.json,
spoken by espeak-ng, three turns per recording with 1.5 s of silence after each (where an agent
would answer); the middle turn of every recording is said in two halves with a 0.5 s pause inside
the sentence (a hesitation: no turn should end there). A real server (`parakeet-serve`, the demo
model, float32) receives each recording paced in real time (80 ms packets), several at once.
Measured per turn, from the end of its speech (the last 10 ms frame above -40 dB of the peak):
- EndOfTurn latency: wall-clock time until its EndOfTurn arrives;
- where it was decided: the end of the audio the EndOfTurn covers (its `audio_window_end`), after
  the end of speech: the model's own timing, which a busy machine does not change;
- EagerEndOfTurn latency likewise (with `--eager`);
- false ends: an EndOfTurn from the start of a mid-sentence pause to the end of that sentence's
  speech, over the pauses.
The worst turns (`--worst N`) say which recording and turn, the EndOfTurn latency, its trigger, the
client's lateness sending the packet that holds the end of speech and the most late of its packets
up to the EndOfTurn (the pacing's own delay, not the server's), and how long the recording's stream
waited before its first result (a stream queued for a slot). The server's log goes to
results/bench_turns_server.log (`--server-log`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, ROOT, percentiles
from demo_model.speech import FIXTURE, synth

RATE = 16000
PACKET = 1280  # 80 ms, what Deepgram recommends for Flux
GAP = 1.5  # seconds of silence after each turn
PAUSE = 0.5  # seconds of silence inside the middle turn's sentence
TURNS = 3
# an event whose audio window ends this close before the end of speech answers it: the model's
# lookahead has heard past the window's end (which counts the frames decoded)
EARLY = 0.1


def speech_end(audio: np.ndarray) -> float:
    """Seconds to the end of the last 10 ms frame within 40 dB of the loudest one."""
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)
    energy = (frames**2).mean(1)
    loud = np.nonzero(energy > energy.max() * 1e-4)[0]
    return (loud[-1] + 1) * 160 / RATE


def silences(audio: np.ndarray, shortest: float) -> list[tuple[float, float]]:
    """(start, end) in seconds of the runs of quiet 10 ms frames (30 dB under the loudest) at least `shortest` long."""
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)
    energy = (frames**2).mean(1)
    quiet = np.concatenate([[False], energy <= energy.max() * 1e-3, [False]])
    edges = np.flatnonzero(np.diff(quiet.astype(int)))
    return [(a * 0.01, b * 0.01) for a, b in zip(edges[::2], edges[1::2]) if (b - a) * 0.01 >= shortest]


def recordings() -> list[dict]:
    """[{audio, turns: [(start, end of speech)], pauses: [(start, end of that turn's speech)]}] in seconds."""
    fixture = json.loads(FIXTURE.read_text())
    items = fixture["seen_voices"] + fixture["heldout_voices"]
    out = []
    for r in range(len(items) // TURNS):
        parts, turns, pauses, t = [], [], [], 0.0
        for k, item in enumerate(items[r * TURNS : (r + 1) * TURNS]):
            words = item["text"].split()
            if k == 1:  # a hesitation inside the sentence, its prosody whole (SSML)
                half = len(words) // 2
                text = " ".join(words[:half]) + f' <break time="{int(PAUSE * 1000)}ms"/> ' + " ".join(words[half:])
                item = {**item, "text": f"<speak>{text}</speak>"}
            audio = synth(item, seed=100 * r + k)
            end = t + speech_end(audio)
            if k == 1:  # an end from the pause's start to the end of the sentence is false
                pauses += [(t + a, end) for a, _ in silences(audio[: int((end - t) * RATE)], 0.8 * PAUSE)]
            turns.append((t, end))
            parts += [audio, np.zeros(int(GAP * RATE), np.float32)]
            t += len(audio) / RATE + GAP
        out.append({"audio": np.concatenate(parts), "turns": turns, "pauses": pauses})
    return out


async def stream(ws_port: int, recording: dict, eager: float | None) -> tuple[list[tuple[float, dict]], list[float]]:
    """The recording paced in real time; every message with its arrival, in seconds from the first
    packet, and each packet's lateness (seconds sent after its audio's time)."""
    import websockets

    query = "encoding=linear16&sample_rate=16000" + (f"&eager_eot_threshold={eager}" if eager else "")
    pcm = (np.clip(recording["audio"], -1, 1) * 32767).astype("<i2").tobytes()
    got: list[tuple[float, dict]] = []
    late: list[float] = []
    # (no keepalive pings: a client held up, a machine paused, ends its run with a measure, not an error)
    async with websockets.connect(f"ws://127.0.0.1:{ws_port}/v2/listen?{query}", max_size=None, ping_interval=None) as ws:
        start = time.monotonic()

        async def read() -> None:
            async for message in ws:
                got.append((time.monotonic() - start, json.loads(message)))

        reader = asyncio.create_task(read())
        for i in range(0, len(pcm), 2 * PACKET):
            due = start + i / 2 / RATE
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            late.append(time.monotonic() - due)
            await ws.send(pcm[i : i + 2 * PACKET])
        await ws.send(json.dumps({"type": "CloseStream"}))
        await reader
    return got, late


def measure(recording: dict, got: list[tuple[float, dict]], late: list[float]) -> dict:
    """Latencies per turn (None where its event never came in time), the false ends, and each
    EndOfTurn's trigger and the client's send lateness around it."""
    ends = [(at, m) for at, m in got if m.get("event") == "EndOfTurn"]
    eagers = [(at, m) for at, m in got if m.get("event") == "EagerEndOfTurn"]
    bounds = [start for start, _ in recording["turns"][1:]] + [float("inf")]

    def first_after(events, end, limit):
        return next(((at - end, m) for at, m in events if end - EARLY <= m["audio_window_end"] < limit), (None, None))

    def packet(t: float) -> int:  # the packet that holds second t of the recording
        return min(int(t * RATE) // PACKET, len(late) - 1)

    turns = []
    for k, ((_, end), limit) in enumerate(zip(recording["turns"], bounds)):
        latency, message = first_after(ends, end, limit)
        upto = packet(end + max(latency or 0.0, 0.0))
        turns.append({"turn": k, "end_of_turn_s": latency, "trigger": message and message.get("trigger"),
                      "window_end": message and message["audio_window_end"], "speech_end": round(end, 3),
                      "late_at_end_s": late[packet(end)], "late_max_s": max(late[packet(end) : upto + 1])})
    first = next((at for at, m in got if m.get("type") == "TurnInfo"), None)
    return {
        "end": [t["end_of_turn_s"] for t in turns],
        "turn_details": turns,
        "first_result_s": first,
        "eager": [first_after(eagers, end, limit)[0] for (_, end), limit in zip(recording["turns"], bounds)],
        "false_ends": sum(any(a <= m["audio_window_end"] < b - EARLY for _, m in ends) for a, b in recording["pauses"]),
        "pauses": len(recording["pauses"]),
        "triggers": [m["trigger"] for _, m in ends],
    }


def start_server(model: str, log_path: Path, extra: list[str]) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "parakeet_stream.server.cli", "--model", model, "--dtype", "float32",
           "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "off", *extra]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
    for line in server.stdout:
        if line.startswith("parakeet-serve ready:"):
            threading.Thread(target=server.stdout.read, daemon=True).start()  # a full pipe would stall it
            return server, int(line.split("ws://127.0.0.1:")[1].split()[0])
    raise SystemExit("the server did not start")


async def run(args) -> dict:
    records = recordings()
    server, port = start_server(args.model, args.server_log, args.server_args.split())
    try:
        gate = asyncio.Semaphore(args.concurrency)

        async def one(recording):
            async with gate:
                return measure(recording, *await stream(port, recording, args.eager))

        found = await asyncio.gather(*(one(r) for r in records))
    finally:
        server.terminate()
        server.wait(30)
    ends = [x for f in found for x in f["end"] if x is not None]
    eagers = [x for f in found for x in f["eager"] if x is not None]
    turns = sum(len(f["end"]) for f in found)
    return {
        "model": args.model, "recordings": len(records), "turns": turns, "concurrency": args.concurrency, "eager_eot_threshold": args.eager,
        "end_of_turn_ms": percentiles(ends, (50, 95), 1000, 0) | {"ended": len(ends)},
        # where in the audio each EndOfTurn was decided: the model's own timing, whatever the machine's load
        "decided_after_speech_ms": percentiles(
            [t["window_end"] - t["speech_end"] for f in found for t in f["turn_details"] if t["window_end"] is not None],
            (50, 95), 1000, 0),
        "eager_ms": percentiles(eagers, (50, 95), 1000, 0) | {"sent": len(eagers)},
        "false_ends": sum(f["false_ends"] for f in found), "mid_sentence_pauses": sum(f["pauses"] for f in found),
        "triggers": {t: sum(f["triggers"].count(t) for f in found) for t in ("model", "timeout", "manual")},
        "send_late_ms": percentiles([t["late_max_s"] for f in found for t in f["turn_details"]], (50, 95, 100), 1000, 0),
        "first_result_s": percentiles([f["first_result_s"] for f in found if f["first_result_s"] is not None], (50, 95, 100), 1, 2),
        "worst": worst(found, args.worst),
    }


def worst(found: list[dict], n: int) -> list[dict]:
    """The n slowest EndOfTurns (a turn that got none first), each with its recording and turn."""
    rows = [{"recording": r, **t, "first_result_s": f["first_result_s"]}
            for r, f in enumerate(found) for t in f["turn_details"]]
    rows.sort(key=lambda t: -math.inf if t["end_of_turn_s"] is None else -t["end_of_turn_s"])
    return rows[:n]


def print_worst(rows: list[dict]) -> None:
    def ms(x):
        return "-" if x is None else f"{x * 1000:.0f}"

    print(f"worst {len(rows)} EndOfTurn(s): recording, turn, latency ms (None: none came), trigger, "
          "client's send lateness ms (the packet at the end of speech / the most up to the EndOfTurn), "
          "the recording's first result s")
    for t in rows:
        print(f"  rec {t['recording']:2d} turn {t['turn']}  {ms(t['end_of_turn_s']):>6}  {t['trigger'] or '-':8s}"
              f"  late {ms(t['late_at_end_s'])}/{ms(t['late_max_s'])}  first result {t['first_result_s']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eager", type=float, default=0.5, help="eager_eot_threshold (0: no eager ends)")
    parser.add_argument("--concurrency", type=int, default=4, help="recordings streamed at once")
    parser.add_argument("--model", default="demo", help="what parakeet-serve --model takes (small needs its weights)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_turns.json")
    parser.add_argument("--worst", type=int, default=5, help="print the N slowest EndOfTurns (0: none)")
    parser.add_argument("--server-log", type=Path, default=RESULTS / "bench_turns_server.log", help="the server's log")
    parser.add_argument("--server-args", default="", help="more parakeet-serve arguments, e.g. '--max-num-streams 3'")
    args = parser.parse_args()
    args.eager = args.eager or None
    report = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "worst"}, indent=1))
    if args.worst:
        print_worst(report["worst"])


if __name__ == "__main__":
    main()

"""Files beside live streams: offline speed of bulk work (RTFx), alone and with N real-time streams,
and those streams' chunk latency with and without it, in one run.

Five phases, each on a fresh engine over the same model (warmed up by a short file first): N live streams alone; one file alone;
F files alone; one file with the N live streams; F files with them. Files go through the path
uploads and parakeet-transcribe take (server/protocols/files: `transcribe_files`, bulk engine streams, the
model's longest lookahead); RTFx = seconds of file audio / wall seconds until every file's final
result. Live streams push speech paced at real time in 20-160 ms packets (as benchmarks/engine.py);
chunk latency = the engine's, from the arrival of the last sample a chunk needs to its result.
Beside files, the live streams start WARMUP_S before them and stop when the files are done; only
the latencies of chunks that came while files were being transcribed count. With --repeat R the
five phases run R times in turn (on a shared machine the load drifts: interleaving spreads it over
every phase) and the summary takes each figure's median.

    python -m benchmarks.files --model demo --files 8 --file-seconds 30 --live 4 --live-seconds 20 --repeat 3

Writes results/bench_files.json (--out: every run of every phase, the medians, their ratios) and
prints one line per phase run.
"""

from __future__ import annotations

import argparse
import heapq
import json
import threading
import time
from pathlib import Path

import numpy as np
import trio

from benchmarks.common import RESULTS, machine, percentile, speech
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.options import thread_count
from parakeet_stream.host import single_threaded_host
from parakeet_stream.model.loading import load_model
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.precision import set_precision
from parakeet_stream.server.protocols.files.batch import ArraySource, transcribe_files

WARMUP_S = 1.0
RATE = 16000
PHASES = ("live_alone", "one_file_alone", "files_alone", "one_file_with_live", "files_with_live")


class LiveStreams:
    """N real-time streams pushing looped speech until stopped; (arrival time, latency) of every chunk."""

    def __init__(self, engine: ASREngine, n: int):
        self.engine, self.n = engine, n
        self.stop = threading.Event()
        self.latencies: list[tuple[float, float]] = []
        rng = np.random.default_rng(n)
        self._packets = [int(rng.integers(20, 161)) * 16 for _ in range(n)]  # samples per packet
        self._audio = [speech(60.0, 100 + i) for i in range(n)]

    def run(self) -> None:
        """Push until `stop` is set, then finalize every stream and wait for its final result."""
        sids = [self.engine.create_stream() for _ in range(self.n)]
        finals: set[int] = set()
        wake = threading.Event()
        for sid in sids:
            self.engine.add_listener(sid, wake.set)
        collector = threading.Thread(target=self._collect, args=(sids, finals, wake), daemon=True)
        collector.start()
        start = time.monotonic()
        heap = [(start + i * 0.16 / self.n, i, 0) for i in range(self.n)]
        while not self.stop.is_set():
            at, i, pos = heapq.heappop(heap)
            if (delay := at - time.monotonic()) > 0:
                self.stop.wait(delay)
            audio = self._audio[i]
            self.engine.push_audio(sids[i], np.take(audio, range(pos, pos + self._packets[i]), mode="wrap"))
            heapq.heappush(heap, (at + self._packets[i] / RATE, i, (pos + self._packets[i]) % len(audio)))
        for sid in sids:
            self.engine.finalize(sid)
        collector.join(120)

    def _collect(self, sids: list[int], finals: set[int], wake: threading.Event) -> None:
        while len(finals) < len(sids):
            wake.wait(0.5)
            wake.clear()
            for sid in sids:
                for r in self.engine.collect(sid):
                    if r.latency is not None:
                        self.latencies.append((time.monotonic() - r.latency, r.latency))
                    if r.is_final:
                        finals.add(sid)

    def summary(self, since: float, until: float) -> dict:
        lat = [l * 1000 for t, l in self.latencies if since <= t <= until]
        return {"streams": self.n, "chunks": len(lat), "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
                "p99_ms": percentile(lat, 99), "max_ms": max(lat, default=None)}


def transcribe(engine: ASREngine, audios: list[np.ndarray]) -> dict:
    """Every file through the files path at once; its speed."""
    sources = {f"file{i}": ArraySource(a) for i, a in enumerate(audios)}
    start = time.monotonic()
    out = trio.run(transcribe_files, engine, sources)
    wall = time.monotonic() - start
    seconds = sum(len(a) for a in audios) / RATE
    errors = [t.error for t in out.values() if t.error]
    return {"files": len(audios), "audio_s": seconds, "wall_s": wall, "rtfx": seconds / wall, "errors": errors}


def live_alone(engine: ASREngine, n: int, seconds: float) -> dict:
    live = LiveStreams(engine, n)
    timer = threading.Timer(WARMUP_S + seconds, live.stop.set)
    timer.start()
    start = time.monotonic()
    live.run()
    return live.summary(start + WARMUP_S, start + WARMUP_S + seconds)


def files_with_live(engine: ASREngine, audios: list[np.ndarray], n: int) -> dict:
    live = LiveStreams(engine, n)
    runner = threading.Thread(target=live.run)
    runner.start()
    time.sleep(WARMUP_S)
    start = time.monotonic()
    try:
        result = transcribe(engine, audios)
    finally:
        live.stop.set()
        runner.join()
    return result | {"live": live.summary(start, start + result["wall_s"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="demo, small, large or a model folder")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--threads", type=thread_count, default=None,
                    help="the encoder's intra-op threads (default: the engine's, see parakeet-serve --help)")
    ap.add_argument("--files", type=int, default=8, help="files in the many-files phases")
    ap.add_argument("--file-seconds", type=float, default=30.0, help="audio per file")
    ap.add_argument("--live", type=int, default=4, help="real-time streams beside the files")
    ap.add_argument("--live-seconds", type=float, default=20.0, help="length of the live-alone phase")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the five phases, in turn")
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_files.json")
    ap.add_argument("--phases", default=",".join(PHASES), type=phase_list,
                    help=f"which phases, comma-separated, of {', '.join(PHASES)} (the ratios need all)")
    args = ap.parse_args()
    single_threaded_host()
    model = set_precision(load_model(args.model, args.device), args.dtype)
    audios = [speech(args.file_seconds, seed) for seed in range(args.files)]
    phases = {
        "live_alone": lambda e: live_alone(e, args.live, args.live_seconds),
        "one_file_alone": lambda e: transcribe(e, audios[:1]),
        "files_alone": lambda e: transcribe(e, audios),
        "one_file_with_live": lambda e: files_with_live(e, audios[:1], args.live),
        "files_with_live": lambda e: files_with_live(e, audios, args.live),
    }
    phases = {name: phases[name] for name in args.phases}
    runs: dict[str, list[dict]] = {name: [] for name in phases}
    for _ in range(args.repeat):
        for name, phase in phases.items():
            runs[name].append(run_phase(model, args, phase))
            print(f"{name:20s} {one_line(runs[name][-1])}", flush=True)
    medians = {name: median(results) for name, results in runs.items()}
    summary = {"model": args.model, "device": args.device, "dtype": args.dtype, "threads": args.threads, "machine": machine(args.device) | {"note": "shared machine: compare ratios within this run only"},
               "files": args.files, "file_seconds": args.file_seconds, "live_streams": args.live,
               "repeat": args.repeat, "median": medians, "runs": runs}
    if set(PHASES) <= set(medians):
        summary["ratios"] = ratios(medians)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary.get("ratios", {})))


def phase_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PHASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown phase(s) {', '.join(unknown) or '(none given)'}: "
                                         f"choose from {', '.join(PHASES)}")
    return names


def run_phase(model: ParakeetModel, args: argparse.Namespace, phase) -> dict:
    with ASREngine(model, args.device, max_num_streams=args.files + args.live, dtype=model.encoder_dtype,
                   threads=args.threads) as engine:
        transcribe(engine, [speech(WARMUP_S, 999)])  # threads started, step costs measured: as a running server
        out = phase(engine)
        out["chunk_ms"] = {f"{m[0]},{m[1]}": s * 1000 for m, s in engine.info.chunk_seconds.items()}
    return out


def median(results: list[dict]) -> dict:
    """Each number's median over the runs of a phase (nested dicts alike)."""
    out = {}
    for key, value in results[0].items():
        if isinstance(value, dict):
            out[key] = median([r[key] for r in results])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in results if r[key] is not None]
            out[key] = percentile(values, 50)
    return out


def one_line(result: dict) -> str:
    parts = []
    if "rtfx" in result:
        parts.append(f"{result['files']} file(s), {result['audio_s']:.0f} s of audio in {result['wall_s']:.1f} s: "
                     f"RTFx {result['rtfx']:.1f}" + (f" ({len(result['errors'])} failed)" if result["errors"] else ""))
    live = result.get("live", result if "p95_ms" in result else None)
    if live:
        parts.append(f"live x{live['streams']}: p50 {live['p50_ms']:.0f} ms, p95 {live['p95_ms']:.0f} ms "
                     f"({live['chunks']} chunks)")
    return "; ".join(parts)


def ratios(r: dict) -> dict:
    """What bulk work and live streams cost each other, measured side by side in this run."""
    alone = r["live_alone"]["p95_ms"]
    return {
        "files_rtfx_over_one_file": r["files_alone"]["rtfx"] / r["one_file_alone"]["rtfx"],
        "one_file_rtfx_with_live_over_alone": r["one_file_with_live"]["rtfx"] / r["one_file_alone"]["rtfx"],
        "files_rtfx_with_live_over_alone": r["files_with_live"]["rtfx"] / r["files_alone"]["rtfx"],
        "live_p95_with_one_file_over_alone": r["one_file_with_live"]["live"]["p95_ms"] / alone,
        "live_p95_with_files_over_alone": r["files_with_live"]["live"]["p95_ms"] / alone,
    }


if __name__ == "__main__":
    main()

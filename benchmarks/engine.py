"""In-process engine benchmark: real-time streams, the batched engine in each precision mode vs a
stream-by-stream baseline.

Every stream pushes audio paced at real time in 20-160 ms packets; chunk latency runs from
the arrival of the last sample a chunk needs to its result. Capacity is the most streams
with p95 chunk latency within the latency target and no growing backlog. The baseline is the same
engine in float32 with max_batch=1 (the same model, one stream per forward pass). All run
in one process, one after the other at each concurrency level; capacities are printed as
ratios to the baseline's.

    python -m benchmarks.engine --model weights/random-small --streams 1 2 4 8 16 32 --modes float32 bfloat16 int8
"""

from __future__ import annotations

import argparse
import heapq
import json
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, percentile, speech
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.latency import DEFAULT_TARGET
from parakeet_stream.host import single_threaded_host
from parakeet_stream.model.loading import load_model
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.precision import set_precision

def run_level(engine: ASREngine, n: int, seconds: float, lookahead, packet_ms: tuple[int, int] = (20, 160)) -> dict:
    audios = [speech(seconds, seed) for seed in range(n)]
    rng = np.random.default_rng(n)
    packets = [int(rng.integers(packet_ms[0], packet_ms[1] + 1)) * 16 for _ in range(n)]  # samples per packet
    sids = [engine.create_stream(lookahead) for _ in range(n)]
    latencies: list[tuple[float, float]] = []
    finals: dict[int, float] = {}
    done = threading.Event()
    wake = threading.Event()
    for sid in sids:
        engine.add_listener(sid, wake.set)

    def collect():
        while len(finals) < n:
            wake.wait(0.5)
            wake.clear()
            for sid in sids:
                for r in engine.collect(sid):
                    if r.latency is not None:
                        latencies.append((time.monotonic(), r.latency))
                    if r.is_final:
                        finals[sid] = time.monotonic()
        done.set()

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    t0 = time.monotonic() + 0.05
    heap = [(t0 + rng.uniform(0, 0.16), i, 0) for i in range(n)]
    finalized: dict[int, float] = {}
    while heap:
        at, i, pos = heapq.heappop(heap)
        delay = at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        chunk = audios[i][pos : pos + packets[i]]
        engine.push_audio(sids[i], chunk)
        if pos + packets[i] < len(audios[i]):
            heapq.heappush(heap, (at + packets[i] / 16000, i, pos + packets[i]))
        else:
            engine.finalize(sids[i])
            finalized[sids[i]] = time.monotonic()
    done.wait(300)
    lat = [l * 1000 for _, l in latencies]
    third = max(1, len(lat) // 3)
    to_final = [(finals[s] - finalized[s]) * 1000 for s in sids if s in finals]
    return {
        "streams": n,
        "chunks": len(lat),
        "p50_ms": percentile(lat, 50),
        "p95_ms": percentile(lat, 95),
        "p99_ms": percentile(lat, 99),
        "p95_first_third_ms": percentile(lat[:third], 95),
        "p95_last_third_ms": percentile(lat[-third:], 95),
        "time_to_final_p95_ms": percentile(to_final, 95),
    }


def keeps_up(level: dict, target_ms: float, chunk_ms: float) -> bool:
    growing = level["p95_last_third_ms"] > level["p95_first_third_ms"] + 2 * chunk_ms
    return level["p95_ms"] <= target_ms and not growing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="weights/random-small", help="model folder (see demo_model/random_model.py)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per stream")
    ap.add_argument("--target-ms", type=float, default=DEFAULT_TARGET * 1000,
                    help="p95 chunk-latency target, the engines' --latency-target too")
    ap.add_argument("--modes", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16", "int8"],
                    help="precision modes of the batched engine (int8: float32 with --quantize int8)")
    ap.add_argument("--lookahead", default=None, help="L,R")
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_engine")
    args = ap.parse_args()
    single_threaded_host()
    lookahead = tuple(int(v) for v in args.lookahead.split(",")) if args.lookahead else None
    slots = max(args.streams)

    def model(mode: str) -> ParakeetModel:
        dtype, quantize = ("float32", "int8") if mode == "int8" else (mode, None)
        return set_precision(load_model(args.model, args.device), dtype, quantize)  # a copy per mode

    models = {mode: model(mode) for mode in args.modes} | {"baseline": model("float32")}
    options = {name: {"max_batch": 1} if name == "baseline" else {} for name in models}
    results: dict[str, list] = {name: [] for name in models}
    for n in args.streams:
        for name, m in models.items():
            # one engine at a time: two engines' encode threads would each own an OpenMP team,
            # which slows both (see single_threaded_host)
            with ASREngine(m, args.device, max_num_streams=slots, lookahead=lookahead, dtype=m.encoder_dtype,
                           latency_target=args.target_ms / 1000, **options[name]) as engine:
                chunk_ms = engine.chunk_seconds() * 1000
                level = run_level(engine, n, args.seconds, lookahead)
            results[name].append(level)
            print(f"{name:8s} N={n:3d} p50={level['p50_ms']:7.1f} ms p95={level['p95_ms']:7.1f} ms "
                  f"final p95={level['time_to_final_p95_ms'] or 0:7.1f} ms", flush=True)
    capacity = {name: max([lv["streams"] for lv in lv_list if keeps_up(lv, args.target_ms, chunk_ms)], default=0)
                for name, lv_list in results.items()}
    summary = {"model": args.model, "device": args.device, "target_ms": args.target_ms, "chunk_ms": chunk_ms,
               "capacity": capacity, "levels": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    plot(summary, args.out.with_suffix(".png"))
    print(json.dumps({"capacity": capacity, "target_ms": args.target_ms}))
    for name, n in capacity.items():
        print(f"capacity {name}: {n} streams ({n / max(capacity['baseline'], 1):.1f}x the baseline)")


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, levels in summary["levels"].items():
        n = [lv["streams"] for lv in levels]
        ax.plot(n, [lv["p95_ms"] for lv in levels], marker="o", label=f"{name} p95")
        ax.plot(n, [lv["p50_ms"] for lv in levels], marker=".", linestyle="--", label=f"{name} p50")
    ax.axhline(summary["target_ms"], color="grey", linestyle=":", label="target")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent real-time streams")
    ax.set_ylabel("chunk latency (ms)")
    ax.set_title(f"{Path(summary['model']).name} on {summary['device']}: capacity {summary['capacity']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

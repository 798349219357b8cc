"""`parakeet-bench`: real-time clients against a running server; latency, capacity, time to final.

Each level runs N clients at once. Every client streams audio paced at real time in packets of
20-160 ms (sizes rotate between clients) and records every result. Definitions:
chunk latency = the server's `latency` field plus its own send delay (arrival of the last sample
a chunk needs -> result sent); lag = result arrival - the moment the client sent the packet
holding the last sample the result covers, or the latest packet where the server's frame count
runs past it (client side, so never negative; it includes the wait for the lookahead); time to
final = final packet sent -> final result received.
Capacity = most clients with p95 chunk latency within budget, nobody queued or failed, and no
client whose lag keeps growing; "at least N" when N, the highest level tried, was within budget.

    parakeet-bench --url ws://127.0.0.1:8000/ --audio speech.wav --clients 1,4,16 --seconds 20

Without --audio it streams the repository's tests/fixtures/audio/sentence.wav.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import trio

from ..arguments import ArgumentParser
from ..audio import SAMPLE_RATE, AudioError, read_audio
from ..client import ClientError, connect, send_paced

PACKETS_MS = (20, 40, 80, 160)
DEFAULT_AUDIO = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "audio" / "sentence.wav"
STATUS_EVERY_S = 0.5


@dataclass
class ClientRecord:
    packet_ms: int
    chunk_latency: list[float] = field(default_factory=list)
    lag: list[tuple[float, float]] = field(default_factory=list)  # (audio seconds, lag seconds)
    time_to_final: float | None = None
    queued: bool = False
    errors: list[str] = field(default_factory=list)

    def backlog_growing(self, tolerance: float) -> bool:
        """Lag in the last quarter of the stream exceeds the first quarter's by `tolerance`."""
        if len(self.lag) < 8:
            return False
        lags = [lag for _, lag in self.lag]
        quarter = len(lags) // 4
        return float(np.median(lags[-quarter:]) - np.median(lags[:quarter])) > tolerance


async def run_client(url: str, audio: np.ndarray, record: ClientRecord, progress: dict, options: dict) -> None:
    async with connect(url, **options) as stream, trio.open_nursery() as nursery:
        start = trio.current_time()
        sent = {}

        async def sender() -> None:
            await send_paced(stream, audio, SAMPLE_RATE, record.packet_ms / 1000, True)
            sent["final"] = trio.current_time()

        nursery.start_soon(sender)
        seconds = len(audio) / SAMPLE_RATE
        while (message := await stream.receive()) is not None:
            if _record(message, record, start, sent, progress, seconds):
                break
        nursery.cancel_scope.cancel()


def _record(message: dict, record: ClientRecord, start: float, sent: dict, progress: dict, seconds: float) -> bool:
    """Account for one server message; True once the stream is over."""
    kind = message["type"]
    if kind == "queued":
        record.queued = True
    elif kind == "error":
        record.errors.append(message["code"])
    if kind != "result":
        return kind == "error" and message["code"] in ("queue_full", "inference_error", "internal_error")
    now = trio.current_time()
    progress["results"] += 1
    if message["latency"] is not None:
        record.chunk_latency.append(message["latency"])
        record.lag.append((message["audio_seconds"], now - sent_at(start, now, message["audio_seconds"], record, seconds)))
    if message["is_final"]:
        record.time_to_final = now - sent.get("final", now)
    return message["is_final"]


def sent_at(start: float, now: float, audio_seconds: float, record: ClientRecord, seconds: float) -> float:
    """When the packet holding the sample at `audio_seconds` left (packet k leaves k packets after `start`).

    The server counts encoder frames, which can run a little past the samples it has (and a final
    result covers padding past the end): then it is the latest packet sent by `now`.
    """
    packet = record.packet_ms / 1000
    last = max(0.0, min(audio_seconds, seconds, now - start) - 1e-9)
    return start + (last // packet) * packet


async def run_level(url: str, clients: int, audios: list[np.ndarray], options: dict) -> list[ClientRecord]:
    records = [ClientRecord(PACKETS_MS[i % len(PACKETS_MS)]) for i in range(clients)]
    progress = {"results": 0, "clients": clients, "started": trio.current_time()}
    async with trio.open_nursery() as nursery:
        status = nursery.cancel_scope
        nursery.start_soon(show_progress, progress, len(audios[0]) / SAMPLE_RATE)
        async with trio.open_nursery() as streams:
            for i, record in enumerate(records):
                # spread the starts over one packet so the clients are not in lockstep
                await trio.sleep(record.packet_ms / 1000 / clients)
                streams.start_soon(run_client, url, audios[i % len(audios)], record, progress, options)
        status.cancel()
    print(file=sys.stderr)
    return records


async def show_progress(progress: dict, seconds: float) -> None:
    while True:
        elapsed = trio.current_time() - progress["started"]
        print(
            f"\r{progress['clients']:4d} clients  {elapsed:6.1f}/{seconds:.1f} s audio  "
            f"{progress['results']:7d} results",
            end="",
            file=sys.stderr,
            flush=True,
        )
        await trio.sleep(STATUS_EVERY_S)


def summarize(clients: int, records: list[ClientRecord], budget_s: float, tolerance: float) -> dict:
    latency = [x for r in records for x in r.chunk_latency]
    lag = [x for r in records for _, x in r.lag]
    finals = [r.time_to_final for r in records if r.time_to_final is not None]
    growing = sum(r.backlog_growing(tolerance) for r in records)
    queued = sum(r.queued for r in records)
    errors = [e for r in records for e in r.errors]
    level = {
        "clients": clients,
        "results": len(latency),
        "chunk_latency_ms": percentiles(latency),
        "lag_ms": percentiles(lag),
        "time_to_final_ms": percentiles(finals),
        "finals": len(finals),
        "queued_clients": queued,
        "backlog_growing_clients": growing,
        "errors": {code: errors.count(code) for code in sorted(set(errors))},
    }
    p95 = level["chunk_latency_ms"]["p95"]
    level["within_budget"] = (
        p95 is not None and p95 <= budget_s * 1000 and not (growing or queued or errors) and len(finals) == clients
    )
    return level


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(np.asarray(values) * 1000, [50, 95, 99])
    return {"p50": round(float(p50), 2), "p95": round(float(p95), 2), "p99": round(float(p99), 2)}


def capacity(levels: list[dict]) -> int:
    ok = [lv["clients"] for lv in levels if lv["within_budget"]]
    return max(ok, default=0)


def capacity_at_least(levels: list[dict]) -> bool:
    """The highest level tried was within budget: the server may hold more than was tried."""
    top = max(levels, key=lambda lv: lv["clients"], default=None)
    return top is not None and top["within_budget"]


def capacity_text(report: dict) -> str:
    return f"at least {report['capacity']}" if report["capacity_at_least"] else str(report["capacity"])


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [lv for lv in report["levels"] if lv["chunk_latency_ms"]["p50"] is not None]
    xs = [lv["clients"] for lv in levels]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for q, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        ax.plot(xs, [lv["chunk_latency_ms"][q] for lv in levels], style, label=f"chunk latency {q}")
    ax.plot(xs, [lv["time_to_final_ms"]["p95"] for lv in levels], "d--", label="time to final p95")
    ax.axhline(report["budget_ms"], color="red", linestyle=":", label=f"budget {report['budget_ms']:g} ms")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent real-time streams")
    ax.set_ylabel("milliseconds")
    ax.set_title(f"parakeet-bench: capacity {capacity_text(report)} streams")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def client_audio(paths: list[str], seconds: float, clients: int) -> list[np.ndarray]:
    """One signal per client: the files concatenated in a rotated order, tiled to `seconds`."""
    sounds = [read_audio(p) for p in paths]
    out = []
    for i in range(min(clients, len(sounds))):
        joined = np.concatenate(sounds[i:] + sounds[:i])
        reps = int(np.ceil(seconds * SAMPLE_RATE / len(joined)))
        out.append(np.tile(joined, reps)[: int(seconds * SAMPLE_RATE)])
    return out


async def bench(args: argparse.Namespace) -> dict:
    options = {"api_key": args.api_key, "lookahead": args.lookahead}
    levels = []
    for clients in args.clients:
        audios = client_audio(args.audio, args.seconds, clients)
        records = await run_level(args.url, clients, audios, options)
        levels.append(summarize(clients, records, args.budget_ms / 1000, args.growth_tolerance))
        print(json.dumps(levels[-1]), file=sys.stderr)
    return {
        "url": args.url,
        "seconds": args.seconds,
        "packets_ms": list(PACKETS_MS),
        "budget_ms": args.budget_ms,
        "levels": levels,
        "capacity": capacity(levels),
        "capacity_at_least": capacity_at_least(levels),
    }


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="parakeet-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="tcp://127.0.0.1:8765",
                   help="the server: tcp://host:port or ws://host:port/ (default: %(default)s)")
    p.add_argument("--audio", nargs="+", default=None,
                   help="audio files (any rate; streamed as 16 kHz pcm16; default: the repository's sentence.wav)")
    p.add_argument("--clients", default="1,2,4,8", metavar="N[,N...]", type=_levels,
                   help="concurrent clients of each level, comma-separated, run one level after the other; "
                        "capacity is the highest level within budget (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=15.0, help="audio per client (default: %(default)s)")
    p.add_argument("--budget-ms", type=float, default=500.0,
                   help="p95 chunk latency allowed for capacity (default: %(default)s)")
    p.add_argument("--growth-tolerance", type=float, default=0.5,
                   help="lag growth (s) that marks a backlog (default: %(default)s)")
    p.add_argument("--lookahead", default=None, help="per-stream lookahead mode 'L,R' (default: the server's)")
    p.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    p.add_argument("--out", default="results/bench",
                   help="writes OUT.json and OUT.png, relative to the current folder (default: %(default)s)")
    return p


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"client counts of at least 1, comma-separated such as 1,2,4,8, got {text!r}")
    return levels


def _first_error(exc: BaseException) -> BaseException:
    """The first error inside (nested) exception groups: the clients' nurseries wrap what failed."""
    while getattr(exc, "exceptions", None):  # (BaseExceptionGroup, a builtin from Python 3.11)
        exc = exc.exceptions[0]
    return exc


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.audio is None:
        if not DEFAULT_AUDIO.is_file():
            parser.error("--audio is required (this installation has no tests/fixtures/audio/sentence.wav)")
        args.audio = [str(DEFAULT_AUDIO)]
    for path in args.audio:
        try:
            read_audio(path)
        except AudioError as exc:
            parser.error(str(exc))
    try:
        report = trio.run(partial(bench, args))
    except Exception as exc:  # noqa: BLE001 - only connection and server errors become one line
        if not isinstance(error := _first_error(exc), (OSError, ClientError)):
            raise
        print(f"\nparakeet-bench: error: {args.url}: {error}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    try:
        plot(report, out.with_suffix(".png"))
    except ImportError:
        print(f"parakeet-bench: no plot ({out.with_suffix('.png')}): it needs matplotlib: "
              "pip install -e '.[bench]'", file=sys.stderr)
    more = " (the highest level tried: try more --clients)" if report["capacity_at_least"] else ""
    print(f"parakeet-bench: capacity {capacity_text(report)} streams{more}", file=sys.stderr)
    print(json.dumps({"capacity": report["capacity"], "capacity_at_least": report["capacity_at_least"],
                      "json": str(out.with_suffix(".json"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

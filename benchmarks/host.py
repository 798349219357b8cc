"""Host-path benchmark: the real engine with the model's arithmetic replaced by a wait on one
stand-in device, at hundreds to thousands of real-time streams, on a CPU.

On a GPU the arithmetic leaves the host; what stays is the Python around it (features framing,
chunk cutting, scheduling, results, the audio's arrival) and the interpreter lock it shares with
the server's protocol work. This benchmark keeps all of that and swaps the model's calls (the STFT
frames cut from the packed samples and log-mel, pre-encode, encoder layers, greedy decode) for a
sleep on one lock, which takes a step's time off
the host as a GPU would: 9 ms + 0.048 ms per chunk, what random `large` costs in bfloat16 on an
H200 (docs/performance.md), shared 10/70/20 among pre-encode, encode and decode, one step at a
time. The decode stand-in emits one token per chunk, so results carry text. Streams push 20-160 ms
packets in real time from one driver thread (as a server's protocol thread would).

    python -m benchmarks.host --streams 256 512 1024 2048          # results/bench_host.json
    python -m benchmarks.host --streams 1024 --lockstep 30 --device-ms 0,0   # host time per stage
    python -m benchmarks.host --streams 1024 --lockstep 30 --device-ms 0,0 --tensors meta   # as a GPU's host
    python -m benchmarks.host --streams 512 1024 --service   # the streams from another process
    python -m benchmarks.host --streams 1024 --service --packet-ms 20,20   # 20 ms packets

With `--service` the streams come as a server's worker processes send them: from a child process
through the engine client API (`EngineClient`) to the engine service in this one, so the CPU per
chunk is the engine process's whole share of a server (its service threads reading audio and
sending results included) and nothing of the driver's.

Per level, after a 2 s warm-up of the same number of streams on the same engine (the step costs
admission decides by, as on a running server): the chunk latency (p50, p95, first and last third;
a level holds when the last third's p95 is within the target and not above the first third's by
two chunks: all streams start at once, and admission lets a burst in a step at a time), the
capacity admission saw, steps a second and chunks per step, the stages' wall milliseconds per
step, and the process's CPU microseconds per chunk. `--device-ms A,B` sets the step's time model.

By default the engine's tensors are on the CPU, so their operations (cutting the chunks' mel rows,
laying a step out, keeping each slot's frames) run on the host and count as host time, which on a
GPU they are not: there each is a launch of a few microseconds, whatever the batch. `--tensors meta`
puts them on PyTorch's meta device (shapes without data), where an operation costs its dispatch
alone: the host's share of a GPU server, closer than the CPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, ROOT
from benchmarks.engine import keeps_up, run_level
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.calibration import calibrate
from parakeet_stream.engine.ipc.engine_client import EngineClient
from parakeet_stream.engine.runner.model_runner import ModelRunner
from parakeet_stream.engine.options import whole_number
from parakeet_stream.engine.ipc.service import EngineService
from parakeet_stream.host import single_threaded_host
from parakeet_stream.server.operations.memory import freeze_startup_objects
from parakeet_stream.tools.convert import convert

SHARE = {"pre-encode": 0.1, "encode": 0.7, "decode": 0.2}
WARM_UP_ROUNDS = 300  # lockstep: rounds to wait for every stream to be admitted
TOKEN = 5  # what the decode stand-in emits: one token per chunk


class StandIn:
    """One device: a stage's call waits `SHARE[stage] * (fixed + per_row * rows)` ms, one call at a time.
    `tensors`: where the engine's tensors live: `cpu` (every tensor operation runs on the host, as on
    a CPU server) or `meta` (shapes without data: an operation costs its dispatch alone, as a GPU's
    asynchronous launch costs the host)."""

    def __init__(self, fixed_ms: float, per_row_ms: float, tensors: str = "cpu"):
        self.fixed, self.per_row = fixed_ms / 1000, per_row_ms / 1000
        self.tensors = tensors
        self.lock = threading.Lock()

    def wait(self, stage: str, rows: int) -> None:
        with self.lock:
            time.sleep(SHARE[stage] * (self.fixed + self.per_row * rows))

    def install(self, runner: ModelRunner) -> None:
        model, d = runner.model, runner.model.cfg.encoder.d_model
        n_mels, on = model.cfg.features.n_mels, self.tensors

        def frames(segments):  # the samples packed on the host as on a GPU; the frames cut there
            return torch.empty(model.features.pack(segments)[1], 0, device=on)

        def mel(frames):  # part of pre-encode's device time
            return torch.zeros(frames.size(0), n_mels, device=on)

        def pre_encode(feats, lengths, start, mode):
            self.wait("pre-encode", feats.size(0))
            spec = model.encoder.chunk_spec(mode)
            return (torch.zeros(feats.size(0), spec.out_frames, d, device=on),
                    torch.full((feats.size(0),), spec.out_frames, device=on))

        def layers(x, lengths, slots, mode, fixed=False):
            self.wait("encode", x.size(0))
            return x

        def greedy(enc, lengths, slots, fixed=False):
            self.wait("decode", enc.size(0))
            width = enc.size(1) * model.decoder.cfg.max_symbols + 1
            out = torch.zeros(enc.size(0), 3 + 3 * width, dtype=torch.int32)  # GreedyPass.scored()'s layout
            out[:, 0], out[:, 1], out[:, -1] = 1, TOKEN, 1  # one label, the pass finished
            out[:, 1 + 2 * width] = torch.tensor([1.0]).view(torch.int32)
            return out

        model.features.frames, model.features.mel, model.encoder.stream_pre_encode = frames, mel, pre_encode
        runner._layers, runner.step_decoder.greedy = layers, greedy


@contextlib.contextmanager
def stand_in_engine(folder: Path, n: int, device: StandIn, **options) -> Iterator[ASREngine]:
    """The engine for `n` streams of 160 ms chunks, its stages on threads of their own as on a GPU,
    the model's arithmetic replaced by `device`."""
    precision = {"dtype": "float32"} if device.tensors == "meta" else {}  # (no arithmetic to check on meta)
    engine = ASREngine(folder, device.tensors, **precision, max_num_streams=n, max_queue=n, max_batch=n, lookahead=(70, 1), threads=1,
                       calibrate=False, **options)
    device.install(engine.runner)
    calibrate(engine)  # the stand-in's step cost, as a server measures its model's at start-up
    with engine:
        freeze_startup_objects()  # as parakeet-serve does once its engine is made
        try:
            yield engine
        finally:
            gc.unfreeze()  # this engine's objects may be collected once it is gone


def level(folder: Path, n: int, seconds: float, device: StandIn, target_ms: float, service: bool = False,
          packet_ms: tuple[int, int] = (20, 160)) -> dict:
    with stand_in_engine(folder, n, device, latency_target=target_ms / 1000) as engine:
        chunk_ms = engine.chunk_seconds(engine.default_lookahead) * 1000
        driver = (through_service if service else in_process)(engine, n, seconds, packet_ms)
        next(driver)  # warmed up: the step costs admission decides by, as on a running server
        capacity = engine.stats().get("capacity")
        totals0, threads0 = engine.step_totals(), thread_cpu()
        cpu0, wall0 = time.process_time(), time.monotonic()
        out = next(driver)
        cpu, wall, totals, threads = time.process_time() - cpu0, time.monotonic() - wall0, engine.step_totals(), thread_cpu()
        driver.close()
    steps, chunks = max(totals.steps - totals0.steps, 1), totals.chunks - totals0.chunks
    per_chunk = 1e6 / max(out["chunks"], 1)
    # steady state: the last third (a burst of streams is admitted a step at a time: the first
    # ones in the queue carry what they sent while waiting)
    out |= {"holds": out["p95_last_third_ms"] <= target_ms and keeps_up(out, float("inf"), chunk_ms), "capacity": capacity, "steps_per_s": round(steps / wall, 1),
            "chunks_per_step": round(chunks / steps, 1), "cpu_us_per_chunk": round(cpu * per_chunk),
            "thread_cpu_us_per_chunk": {name: round((threads[name] - threads0[name]) * per_chunk, 1)
                                        for name in threads if name in threads0},
            "stage_ms_per_step": {k: round(1000 * (v - totals0.seconds.get(k, 0.0)) / steps, 2)
                                  for k, v in totals.seconds.items()},
            "chunks_per_s": round(out["chunks"] / wall)}
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def in_process(engine: ASREngine, n: int, seconds: float, packet_ms: tuple[int, int]) -> Iterator[dict | None]:
    """Streams pushed from a thread of this process: a 2 s warm-up, then the level."""
    run_level(engine, n, 2.0, engine.default_lookahead, packet_ms)
    yield None
    yield run_level(engine, n, seconds, engine.default_lookahead, packet_ms)


def through_service(engine: ASREngine, n: int, seconds: float, packet_ms: tuple[int, int]) -> Iterator[dict | None]:
    """The same streams from a child process through the engine client API, as a worker sends them."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "engine.sock")
        service = EngineService(engine, path).start()
        child = subprocess.Popen([sys.executable, "-m", "benchmarks.host", "--drive", path, "--streams", str(n),
                                  "--seconds", str(seconds), "--packet-ms", ",".join(map(str, packet_ms))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            lines = iter(child.stdout)
            if next(lines, "").strip() != "warm":
                raise SystemExit("benchmarks.host: the driving process failed")
            yield None
            yield json.loads(next(lines))
        finally:
            child.kill()
            child.wait()
            service.close()


def drive(path: str, n: int, seconds: float, packet_ms: tuple[int, int]) -> None:
    """The child of `--service`: the streams through an EngineClient; 'warm', then the level's line,
    then connected until the parent has read its figures (the service's threads end with the client)."""
    client = EngineClient.connect(path)
    run_level(client, n, 2.0, client.info.default_lookahead, packet_ms)
    print("warm", flush=True)
    print(json.dumps(run_level(client, n, seconds, client.info.default_lookahead, packet_ms)), flush=True)
    sys.stdin.read()


def lockstep(folder: Path, n: int, rounds: int, device: StandIn) -> dict:
    """Every stream one 160 ms packet per round, pushed while the Scheduler is held (the round is one
    step), then every result awaited: each stage's host time per chunk with no thread pushing audio
    meanwhile. With `--device-ms 0,0` the stages' times are the host's alone."""
    with stand_in_engine(folder, n, device) as engine:
        sids = [engine.create_stream(engine.default_lookahead) for _ in range(n)]
        packets = (np.random.default_rng(n).standard_normal((n, int(engine.chunk_seconds(engine.default_lookahead)
                                                                      * engine.sample_rate))) * 0.05).astype(np.float32)
        wake = threading.Event()
        for sid in sids:
            engine.add_listener(sid, wake.set)

        def round_(wait: float) -> int:
            with engine.scheduler.paused():
                for sid, packet in zip(sids, packets):
                    engine.push_audio(sid, packet)
            answered, deadline = 0, time.monotonic() + wait
            while answered < n and time.monotonic() < deadline:
                wake.wait(0.05)
                wake.clear()
                answered += sum(r.latency is not None for sid in sids for r in engine.collect(sid))
            return answered

        for _ in range(WARM_UP_ROUNDS):  # admission lets a burst in a step at a time
            if round_(0.5) >= n and engine.stats()["active"] == n:
                break
        else:
            raise SystemExit(f"benchmarks.host: {n} streams were not all admitted and answered after {WARM_UP_ROUNDS} rounds")
        round_(60.0)  # the backlogs of the last admitted
        totals0, cpu0, threads0 = engine.step_totals(), time.process_time(), thread_cpu()
        chunks = sum(round_(60.0) for _ in range(rounds))
        cpu, totals, threads = time.process_time() - cpu0, engine.step_totals(), thread_cpu()
    per_chunk = 1e6 / max(chunks, 1)
    return {"streams": n, "rounds": rounds, "chunks": chunks, "steps": totals.steps - totals0.steps,
            "cpu_us_per_chunk": round(cpu * per_chunk, 1),
            "stage_us_per_chunk": {k: round((v - totals0.seconds.get(k, 0.0)) * per_chunk, 1)
                                   for k, v in totals.seconds.items()},
            "thread_cpu_us_per_chunk": {name: round((threads[name] - threads0[name]) * per_chunk, 1)
                                        for name in threads if name in threads0}}


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process by name (Linux; empty elsewhere). A stage's
    wall time counts its waits for the interpreter lock too; its thread's CPU time does not. The
    driver (pushes, collects) is MainThread; the Scheduler runs on the pre-encode thread, results
    on the decode thread."""
    out: dict[str, float] = {}
    for thread in threading.enumerate():
        try:  # the first field: nanoseconds on a CPU
            ns = int(Path(f"/proc/self/task/{thread.native_id}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
        out[thread.name] = out.get(thread.name, 0.0) + ns / 1e9
    return out


def device_ms(text: str) -> tuple[float, float]:
    try:
        fixed, per_chunk = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"FIXED,PER_CHUNK milliseconds, e.g. 9,0.048; got {text!r}") from None
    if fixed < 0 or per_chunk < 0:
        raise argparse.ArgumentTypeError(f"milliseconds must not be negative; got {text!r}")
    return fixed, per_chunk


def packet_ms(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"LO,HI whole milliseconds, e.g. 20,160; got {text!r}") from None
    if not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"need 1 <= LO <= HI; got {text!r}")
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=whole_number, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--seconds", type=float, default=9.0, help="audio per stream")
    ap.add_argument("--device-ms", type=device_ms, default="9,0.048", help="a step's device time: FIXED,PER_CHUNK milliseconds")
    ap.add_argument("--target-ms", type=float, default=320.0, help="p95 chunk latency a level must hold")
    ap.add_argument("--lockstep", type=whole_number, metavar="ROUNDS",
                    help="instead of real-time levels: ROUNDS rounds of one packet per stream, one step each")
    ap.add_argument("--service", action="store_true",
                    help="real-time levels driven from another process through the engine service")
    ap.add_argument("--packet-ms", type=packet_ms, default="20,160",
                    help="real-time levels: each stream's packets, LO,HI ms (one size per stream, drawn between them)")
    ap.add_argument("--tensors", choices=("cpu", "meta"), default="cpu",
                    help="where the engine's tensors live: cpu (their operations run on the host) or meta "
                         "(an operation costs only its dispatch, as a GPU's launch does)")
    ap.add_argument("--drive", metavar="SOCKET", help=argparse.SUPPRESS)  # --service's child
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_host.json")
    args = ap.parse_args()
    single_threaded_host()
    if args.drive:
        return drive(args.drive, args.streams[0], args.seconds, args.packet_ms)
    fixed, per_row = args.device_ms
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "nemotron_tiny"
        convert(str(ROOT / "tests/fixtures/nemo/nemotron_tiny.nemo"), folder)
        for n in args.streams:
            if args.lockstep:
                runs.append(lockstep(folder, n, args.lockstep, StandIn(fixed, per_row, args.tensors)))
            else:
                runs.append(level(folder, n, args.seconds, StandIn(fixed, per_row, args.tensors), args.target_ms, args.service,
                                  args.packet_ms))
            print(json.dumps(runs[-1]), flush=True)
    if args.lockstep:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"device_ms": [fixed, per_row], "tensors": args.tensors, "lockstep": runs}, indent=2))
        print(f"benchmarks.host: wrote {args.out}")
        return
    held = [r["streams"] for r in runs if r["holds"]]
    summary = {"device_ms": [fixed, per_row], "tensors": args.tensors, "target_ms": args.target_ms, "capacity": max(held, default=0), "service": args.service,
               "packet_ms": list(args.packet_ms), "levels": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))
    print(f"benchmarks.host: {summary['capacity']} streams hold p95 <= {args.target_ms:.0f} ms "
          f"(device {fixed} ms + {per_row} ms per chunk a step); wrote {args.out}")


if __name__ == "__main__":
    main()

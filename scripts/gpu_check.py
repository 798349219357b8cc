"""The GPU check: one command on a new GPU machine (no network; a copy of the repository and its
Python environment with a CUDA build of torch) that answers "how many streams" first, within 8
minutes of a bare machine. It writes one JSON and a markdown table for docs/performance.md, and
prints one verdict line: "capacity N streams at p95 <= 320 ms (chunk p95 X ms), start-up S s".

    bash scripts/gpu_check.sh                 # results/gpu_check.json, .md, -server.log (-profiles.tar.gz)
    bash scripts/gpu_check.sh --dry-run       # the same code on CPU at tiny sizes (tests/test_gpu_check.py)

Parts, in the order of what they answer; each is timed and recorded, one that fails does not stop
the others, and every part after the capacity runs only while time is left:
1. machine: torch, CUDA, the GPU and its memory, bfloat16;
2. model: random-weight `large` made on the spot (demo_model/random_model.py);
3. server: the real server (`parakeet-serve`, graphs on, bfloat16, `--max-num-streams auto`, 160 ms
   chunks) under the TCP load client (benchmarks/vs_parakeet_streaming/loadgen.py, spread over
   processes) at rising stream counts, stopping at the first level that fails and then bisecting
   once: finalization lag p50/p95, the server's chunk latency p95, steps, chunks per step, the
   server's CPU per chunk, GPU busy share, RSS and GPU memory; its start-up time and graph count;
4. start-up, one mode: the same server serving the 160 ms mode only (`--lookahead-modes`);
5. ceiling: pre-encode + encode + decode time of one eager step by batch size (160 ms mode); then
   the beam-search decode of streams with 10 key phrases at the same sizes;
6. invariance: (a) graphs vs eager tokens of the same streams, float32; (b) one stream's tokens
   alone vs among 15 and 255 others, float32 and bfloat16;
7. tests: tests/test_cuda.py and the CUDA test of tests/test_precision.py;
8. precision: agreement of float32 / bfloat16 / float16 on the GPU with CPU float32 (NeMo fixtures).
"""

from __future__ import annotations

import argparse
import difflib
import gc
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import wave
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from benchmarks.common import LOAD_CLIENT, ROOT, machine, speech
from demo_model.random_model import build
from evaluations.precision_report import fixture_agreement
from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.phrases import boosting_tree, check_phrases
from parakeet_stream.host import single_threaded_host
from parakeet_stream.tools.convert import convert

LAG_S = 0.32  # the capacity line: p95 finalization lag
FULL = {"device": "cuda", "model": "large", "dtype": "bfloat16", "lookahead": "70,1", "slots": "auto", "workers": "auto",
        "levels": (64, 128, 256, 512, 1024, 1536, 2048), "seconds": 8.0, "procs": 8,
        "batches": (1, 16, 64, 256, 512, 1024), "graph_streams": 16, "among": (15, 255),
        "tests": ["tests/test_cuda.py", "tests/test_precision.py::test_cuda_engine_matches_cpu_tokens"],
        "precisions": ("float32", "bfloat16", "float16")}
# the key phrases of the ceiling's beam-search figure: lower-case words any tokenizer here can write
PHRASES = [f"{a} {b}" for a in ("anna", "boris", "chen", "dmitri", "elena") for b in ("kowalski", "nguyen")]
DRY = {"device": "cpu", "model": "nemotron_tiny", "dtype": "float32", "lookahead": "70,1", "slots": "8", "workers": "1",
       "levels": (2, 4), "seconds": 2.0, "procs": 2, "batches": (1, 2), "graph_streams": 4, "among": (3,),
       "tests": ["tests/test_cuda.py"], "precisions": ("float32",)}


class Report:
    """The parts' records, written out as each part ends (a check cut short still leaves its figures)."""

    def __init__(self, deadline: float, out: Path, dry_run: bool):
        self.parts: dict[str, dict] = {}
        self.deadline, self.out, self.dry_run = deadline, out, dry_run
        self.stalled: str | None = None  # the server's engine stalled: the GPU may still run what never ended

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def part(self, name: str, work: Callable[[], dict], needs: float = 0.0) -> dict:
        """Runs `work` and records its figures (or why it failed); skipped, and recorded as such, when
        fewer than `needs` seconds are left or (a part on the GPU, `needs` > 0) after a stall."""
        record: dict = {}
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            if self.left() < needs:
                raise TimeoutError(f"skipped: {self.left():.0f} s left, needs {needs:.0f}")
            if self.stalled and needs:
                raise RuntimeError(f"skipped: the server stalled ({self.stalled}); a kernel that never ends "
                                   "outlives its process, so every later GPU figure would be wrong")
            record |= work()
            record["ok"] = True
        except Exception as exc:  # noqa: BLE001 - one part's failure is a finding; the others still run
            record["ok"], record["error"] = False, repr(exc)
            traceback.print_exc()
        record["seconds"] = round(time.perf_counter() - start, 1)
        self.parts[name] = record
        print(json.dumps({name: record}, default=str), flush=True)
        write(self.parts, self.out, self.dry_run)
        return record


def make_model(name: str, work: Path) -> Path:
    folder = work / name
    if not (folder / "config.json").exists():
        if name.endswith("_tiny"):
            convert(str(ROOT / f"tests/fixtures/nemo/{name}.nemo"), folder)
        else:
            build(name, folder)
    return folder


def write_wav(path: Path, seconds: float) -> Path:
    pcm = (np.clip(speech(seconds, 0), -1, 1) * 32767).astype("<i2").tobytes()
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(16000), f.writeframes(pcm)
    return path


# --- the real server under load ----------------------------------------------------------------
class Server:
    """parakeet-serve in a process of its own, on free loopback ports; its start-up timed to the ready line."""

    def __init__(self, model: Path, settings: dict, log: Path, *extra: str):
        cmd = [sys.executable, "-m", "parakeet_stream.server.cli", "--model", str(model), "--device", settings["device"],
               "--dtype", settings["dtype"], "--lookahead", settings["lookahead"], "--max-num-streams", settings["slots"],
               "--workers", settings["workers"], "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "off",
               *extra]
        start = time.monotonic()
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.workers = 0
        for line in self.proc.stdout:
            if line.strip().startswith("workers = "):  # "workers = auto (4)" or "workers = 2"
                self.workers = int(re.findall(r"\d+", line)[-1])
            if line.startswith("parakeet-serve ready:"):
                break
        else:
            raise RuntimeError(f"the server exited before ready ({self.proc.wait()}): see {log}")
        self.ready_seconds = time.monotonic() - start
        self.tcp = int(re.search(r"tcp://[^ ]+:(\d+)", line).group(1))
        self.http = "http://127.0.0.1:" + re.search(r"http://[^ ]+:(\d+)", line).group(1)
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # keep its pipe from filling

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(self.http + "/health", timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as answer:  # 503: an engine thread died or is stalled; the body says which
            return json.load(answer)

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds of the engine's process and of its worker processes (--workers)."""
        children = [int(c) for task in Path(f"/proc/{self.proc.pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
        return _cpu(self.proc.pid), sum(_cpu(pid) for pid in children)

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class GpuSampler:
    """GPU busy share and memory in use, sampled every 100 ms while a level runs (NVML; none on CPU)."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML (CPU, or no driver library): no GPU figures
            self.nvml = None
        self.busy: list[float] = []
        self.memory: list[float] = []
        self._stop = threading.Event()

    def __enter__(self):
        if self.nvml:
            threading.Thread(target=self._sample, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    def _sample(self):
        while not self._stop.wait(0.1):
            self.busy.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            self.memory.append(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**30)

    def figures(self) -> dict:
        if not self.busy:
            return {}
        return {"gpu_busy_pct": round(float(np.mean(self.busy)), 1), "gpu_memory_gib": round(max(self.memory), 1)}


class HealthWatch:
    """The server's /health every second while a level runs: the first stall its engine reports."""

    def __init__(self, server: Server):
        self.server, self.stall = server, None
        self._stop = threading.Event()

    def __enter__(self):
        threading.Thread(target=self._poll, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._look()  # once more at the end: a stall shows only after the engine's limit

    def _poll(self):
        while not self._stop.wait(1.0) and self.stall is None:
            self._look()

    def _look(self):
        try:
            self.stall = self.stall or self.server.health().get("stalled")
        except (OSError, ValueError):  # a 503 answer (broken) or no answer: the next look, or the level's figures
            pass


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # exited meanwhile
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_level(server: Server, wav: Path, n: int, settings: dict) -> dict:
    cpu0 = server.cpu_seconds()
    spy = None
    if settings.get("profile"):  # py-spy's raw stacks of every server thread for the level's middle
        spy = subprocess.Popen([settings["profile"], "record", "-r", "100", "-d", str(int(settings["seconds"] * 0.6)),
                                "-f", "raw", "-o", str(settings["out"].parent / f"server-{n}.txt"), "-p",
                                str(server.proc.pid), "--nonblocking", "--subprocesses"],  # the workers too
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with GpuSampler() as gpu, HealthWatch(server) as health:
        proc = subprocess.run([sys.executable, *LOAD_CLIENT, "--port", str(server.tcp), "--wav", str(wav),
                               "--clients", str(n), "--procs", str(min(settings["procs"], n)), "--final-wait", "10",
                               "--connect-timeout", "20", "--metrics", server.http + "/metrics"],
                              capture_output=True, text=True, timeout=settings["seconds"] + 120, cwd=ROOT)
    if spy is not None:
        spy.wait(30)
    if proc.returncode:
        raise RuntimeError(f"load client failed: {proc.stderr[-1000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    metrics = summary.pop("server_metrics")
    cpu1 = server.cpu_seconds()
    cpu, workers_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
    out = {"streams": n, "ok": summary["ok"], "finished": summary["finished"], "errors": summary["errors"][:3],
           "lag_p50_ms": _ms(summary["lag_p50"]), "lag_p95_ms": _ms(summary["lag_p95"]),
           "chunk_p95_ms": _ms(metrics["chunk_p95"]), "steps": metrics["steps"],
           "chunks_per_step": round(metrics["chunks_per_step"] or 0, 1),
           "ms_per_step": {k[len("ms_per_step_"):]: round(v, 1) for k, v in metrics.items() if k.startswith("ms_per_step_")},
           "server_cpu_s": round(cpu, 1), "server_cpu_us_per_chunk": round(1e6 * cpu / max(metrics["chunks"], 1)),
           "workers_cpu_s": round(workers_cpu, 2),
           "client_cpu_s": round(summary["client_cpu_s"], 1), "rss_mib": round(server.rss_mib())}
    if health.stall:
        out["stalled"] = health.stall
        if settings.get("profile"):  # every thread's Python and native frames, the workers' too
            dump = subprocess.run([settings["profile"], "dump", "--native", "--subprocesses", "-p", str(server.proc.pid)],
                                  capture_output=True, text=True, timeout=60)
            (settings["out"].parent / f"server-{n}-stalled.txt").write_text(dump.stdout + dump.stderr)
    return out | gpu.figures()


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 1)


def capacity(server: Server, wav: Path, settings: dict, report: Report) -> dict:
    """Rising levels until one fails, then one bisection between the last that held and it."""
    runs, best, failed = [], 0, None
    level_s = settings["seconds"] + 25
    for n in settings["levels"]:
        if report.left() < level_s:
            break
        runs.append(load_level(server, wav, n, settings))
        print(json.dumps(runs[-1]), flush=True)
        if runs[-1].get("stalled"):
            report.stalled = describe_stall(n, runs[-1]["stalled"])
        if not runs[-1]["ok"]:
            failed = n
            break
        best = n
    if failed is not None and report.left() >= level_s and not report.stalled:
        mid = (best + failed) // 2
        if mid not in (best, failed):
            runs.append(load_level(server, wav, mid, settings))
            print(json.dumps(runs[-1]), flush=True)
            best = mid if runs[-1]["ok"] else best
    held = [r for r in runs if r["ok"] and r["streams"] == best]
    return {"capacity": best, "at_least": failed is None, "chunk_p95_ms": held[0]["chunk_p95_ms"] if held else None,
            "stalled": report.stalled, "levels": runs}


def describe_stall(streams: int, stall: dict) -> str:
    where = f", the GPU not past: {stall['device_at']}" if stall.get("device_at") else ""
    return (f"at {streams} streams, {stall['stage']} on one step for {stall['seconds']} s "
            f"(batches {', '.join(stall['batches']) or 'none'}{where})")


def serve(report: Report, model: Path, settings: dict, work: Path) -> None:
    """The server's start and capacity parts; its log beside the report (`<out>-server.log`)."""
    servers: list[Server] = []
    log_path = report.out.parent / f"{report.out.name}-server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def start() -> dict:
        servers.append(Server(model, settings, log_path))
        health = servers[0].health()
        return {"ready_seconds": round(servers[0].ready_seconds, 1), "engine_start": health.get("start"),
                "workers": servers[0].workers, "slots": health.get("max_num_streams"), "precision": health.get("precision")}

    report.part("server start", start)
    if not servers:
        return
    try:
        wav = write_wav(work / "speech.wav", settings["seconds"])
        report.part("capacity", lambda: capacity(servers[0], wav, settings, report), needs=settings["seconds"] + 25)
    finally:
        servers[0].close()
        log = log_path.read_text()
        report.parts["server start"]["graphs_log"] = [line for line in log.splitlines() if "captured" in line][-1:]
        write(report.parts, report.out, report.dry_run)
        bundle_profiles(report.out)


def bundle_profiles(out: Path) -> None:
    """py-spy's files of every level (server-N.txt, server-N-stalled.txt) in one `<out>-profiles.tar.gz`:
    a GPU machine's tool may bring back only a few files."""
    files = sorted(out.parent.glob("server-*.txt"))
    if files:
        with tarfile.open(out.parent / f"{out.name}-profiles.tar.gz", "w:gz") as tar:
            for f in files:
                tar.add(f, arcname=f.name)
        for f in files:
            f.unlink()


# --- the engine in-process ----------------------------------------------------------------------
def mode_160ms(engine: ASREngine):
    """The lookahead mode with 160 ms chunks (the model's default where it has none)."""
    return next((m for m in engine.lookahead_modes if abs(engine.chunk_seconds(m) - 0.16) < 1e-6), engine.default_lookahead)


@torch.inference_mode()
def ceiling(folder: Path, settings: dict) -> dict:
    """Eager step time by batch size (pre-encode + encoder layers + greedy decode) in the 160 ms mode."""
    rows = {}
    with _engine(folder, settings) as engine:
        runner, model = engine.runner, engine.model
        mode = mode_160ms(engine)
        for b in settings["batches"]:
            rows[b] = _median_ms(_encoded(engine, mode, b, greedy=True), runner.device)
        chunk_ms = engine.chunk_seconds(mode) * 1000
    real_time = [b for b, ms in rows.items() if ms <= chunk_ms]
    return {"mode": list(mode), "chunk_ms": chunk_ms, "step_ms": rows, "streams_in_real_time": max(real_time, default=0)}


@torch.inference_mode()
def beam_ceiling(folder: Path, settings: dict) -> dict:
    """The decode alone as the streams with key phrases get it (the beam search in fixed shapes, 10
    phrases per stream), by batch size, on the ceiling's encoder output."""
    rows = {}
    with _engine(folder, settings) as engine:
        runner = engine.runner
        tree = boosting_tree(check_phrases(PHRASES), engine.model.tokenizer)
        for slot in range(max(settings["batches"])):
            runner.boost.load(slot, tree)
        for b in settings["batches"]:
            enc, lengths, slots = _encoded(engine, mode_160ms(engine), b)()
            runner.beams.reset(slots)
            rows[b] = _median_ms(lambda: runner.step_decoder.beam(enc, lengths, slots, fixed=True), runner.device)
    return {"decode_ms": rows}


def _engine(folder: Path, settings: dict) -> ASREngine:
    batch = max(settings["batches"])
    return ASREngine(folder, settings["device"], max_num_streams=batch, max_batch=batch, dtype=settings["dtype"],
                     cuda_graphs=False)


def _encoded(engine: ASREngine, mode, b: int, greedy: bool = False):
    """A step over `b` random chunks, eagerly: -> a call that runs its pre-encode and encoder layers
    (and with `greedy` the greedy pass) and returns (encoder output, valid frames, slots)."""
    runner, model = engine.runner, engine.model
    spec = model.encoder.chunk_spec(mode)
    feats = torch.randn(b, spec.window, model.cfg.features.n_mels, device=runner.device).to(model.encoder_dtype)
    full = torch.full((b,), spec.window, device=runner.device)
    slots = torch.arange(b, device=runner.device)

    def step():
        x, lengths = model.encoder.stream_pre_encode(feats, full, torch.zeros_like(full), mode)
        enc = runner._layers(x, lengths, slots, mode=mode).float()
        if greedy:
            runner.step_decoder.greedy(enc, lengths, slots)
        return enc, lengths, slots

    return step


def _median_ms(call, device: torch.device, runs: int = 8) -> float:
    """The median time of `call` over `runs` (the first two left out), the device synchronized."""
    cuda, times = device.type == "cuda", []
    for i in range(runs):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return round(float(np.median(times)) * 1000, 2)


def stream_tokens(engine: ASREngine, audios: list[np.ndarray], modes: list) -> list[list[int]]:
    sids = [engine.create_stream(modes[i % len(modes)]) for i in range(len(audios))]
    for at in range(0, max(map(len, audios)), 2560):
        for sid, audio in zip(sids, audios):
            if at < len(audio):
                engine.push_audio(sid, audio[at : at + 2560])
    for sid in sids:
        engine.finalize(sid)
    out = []
    for sid in sids:
        tokens, done = [], False
        while not done:
            engine.wait_for_update(sid, timeout=1.0)
            for r in engine.collect(sid):
                if r.error:
                    raise RuntimeError(f"stream {sid}: {r.error}")
                tokens += r.token_ids
                done = done or r.is_final
        out.append(tokens)
    return out


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    pairs = list(zip(a, b))
    matched = sum(m.size for x, y in pairs for m in difflib.SequenceMatcher(a=x, b=y, autojunk=False).get_matching_blocks())
    total = sum(max(len(x), len(y)) for x, y in pairs)
    return {"equal": a == b, "agreement": round(matched / max(total, 1), 4), "tokens": total}


def graphs_vs_eager(folder: Path, settings: dict) -> dict:
    """(a) The same streams through CUDA graphs and eagerly, float32, every lookahead mode."""
    n = settings["graph_streams"]
    audios = [speech(6.0, seed) for seed in range(n)]
    found, eager_calls = {}, None
    for graphs in (True, False):
        with ASREngine(folder, settings["device"], max_num_streams=n, max_batch=n, cuda_graphs=graphs) as engine:
            found[graphs] = stream_tokens(engine, audios, engine.lookahead_modes)
            if graphs:
                eager_calls = sum(s.eager_calls for s in engine.runner.static_batches)
    return agreement(found[True], found[False]) | {"eager_calls": eager_calls}


def alone_vs_among(folder: Path, settings: dict, dtype: str, probes: int = 4) -> dict:
    """(b) The tokens of a few streams, each alone, and among k others (different audio), eager."""
    most = max(settings["among"]) + 1
    audios = [speech(8.0, seed) for seed in range(most)]
    with ASREngine(folder, settings["device"], max_num_streams=most, max_batch=most, dtype=dtype,
                   cuda_graphs=False) as engine:
        mode = [mode_160ms(engine)]
        alone = [stream_tokens(engine, [audio], mode)[0] for audio in audios[:probes]]
        return {f"among {k}": agreement(alone, stream_tokens(engine, audios[: k + 1], mode)[:probes])
                for k in settings["among"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on CPU, tiny models and sizes: the code, not the figures")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check")
    ap.add_argument("--work", type=Path, default=None, help="where the random model goes (default: a temporary folder)")
    ap.add_argument("--minutes", type=float, default=7.0, help="the whole check ends by then: later parts are skipped")
    ap.add_argument("--profile", metavar="PY_SPY", help="py-spy's path: record the server during each load level "
                    "(server-N.txt beside --out, py-spy's raw format)")
    args = ap.parse_args()
    if args.profile and not os.access(args.profile, os.X_OK):
        ap.error(f"--profile: {args.profile} is not an executable py-spy")
    settings = (DRY if args.dry_run else FULL) | {"profile": args.profile, "out": args.out}
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device visible to torch (use --dry-run on CPU)")
    single_threaded_host()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # thousands of connections, server and clients
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    report = Report(time.monotonic() + args.minutes * 60, args.out, args.dry_run)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        run_parts(report, settings, work)
    failed = [name for name, rec in report.parts.items() if not rec.get("ok")]
    print(f"gpu_check: {len(report.parts) - len(failed)}/{len(report.parts)} parts ok"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    print(verdict(report.parts))
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")


def run_parts(report: Report, settings: dict, work: Path) -> None:
    device = settings["device"]
    report.part("machine", lambda: machine(device))
    folder = work / settings["model"]
    if not report.part("model", lambda: {"model": settings["model"], "folder": make_model(settings["model"], work)})["ok"]:
        return
    serve(report, folder, settings, work)
    print(verdict(report.parts), flush=True)
    for name, needs, figures in (
        ("start-up, one mode", 45, lambda: one_mode_start(folder, settings, report.out)),
        ("ceiling", 30, lambda: ceiling(folder, settings)),
        ("beam ceiling", 20, lambda: beam_ceiling(folder, settings)),
        ("graphs vs eager", 60, lambda: graphs_vs_eager(folder, settings)),
        *((f"alone vs among {dtype}", 45, partial(alone_vs_among, folder, settings, dtype))
          for dtype in dict.fromkeys(("float32", settings["dtype"]))),
        ("tests", 120, lambda: run_tests(settings["tests"], timeout=max(10.0, report.left()))),
        ("precision", 60, lambda: precision(settings, device)),
    ):
        report.part(name, figures, needs=needs)
        _free(device)


def one_mode_start(model: Path, settings: dict, out: Path) -> dict:
    """The server's start-up serving the 160 ms mode only (`--lookahead-modes`): its graphs alone."""
    server = Server(model, settings, out.parent / f"{out.name}-one-mode.log", "--lookahead-modes", settings["lookahead"])
    try:
        health = server.health()
        return {"ready_seconds": round(server.ready_seconds, 1), "engine_start": health.get("start")}
    finally:
        server.close()


def precision(settings: dict, device: str) -> dict:
    worst = fixture_agreement(list(settings["precisions"]), device)
    return {"fixture_agreement": {mode: min(v) for mode, v in worst.items()}}


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_tests(args: list[str], timeout: float) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    out = {"returncode": proc.returncode, "summary": lines[-1] if lines else ""}
    if proc.returncode:
        out["tail"] = "\n".join(lines[-40:]) + proc.stderr[-2000:]
        raise AssertionError(out["summary"] or proc.stderr[-500:])
    return out


def verdict(parts: dict) -> str:
    cap, start = parts.get("capacity", {}), parts.get("server start", {})
    if not cap.get("ok"):
        return f"gpu_check verdict: no capacity figure ({cap.get('error') or start.get('error')})"
    stalled = f"; STALLED {cap['stalled']}" if cap.get("stalled") else ""
    return (f"gpu_check verdict: capacity {'at least ' if cap['at_least'] else ''}{cap['capacity']} streams at p95 <= "
            f"{LAG_S * 1000:.0f} ms (chunk p95 {cap['chunk_p95_ms']} ms), start-up {start.get('ready_seconds')} s{stalled}")


def write(parts: dict, out: Path, dry_run: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"dry_run": dry_run, "parts": parts}, indent=2, default=str))
    out.with_suffix(".md").write_text(markdown(parts))


def markdown(parts: dict) -> str:
    m, start = parts.get("machine", {}), parts.get("server start", {})
    one = parts.get("start-up, one mode", {})
    lines = [f"GPU check: {m.get('gpu', m.get('device'))}, {m.get('memory_gib', '-')} GiB, torch {m.get('torch')} "
             f"(CUDA {m.get('cuda')}); model "
             f"{parts.get('model', {}).get('model')}; server ready in {start.get('ready_seconds')} s "
             f"(engine {start.get('engine_start')}), slots {start.get('slots')}, worker processes "
             f"{start.get('workers')}; serving one mode, ready in {one.get('ready_seconds')} s "
             f"(engine {one.get('engine_start')})", "", verdict(parts), "",
             "| streams | held | lag p50 / p95 (ms) | chunk p95 (ms) | steps | chunks per step | ms per step "
             "| engine process CPU per chunk (us) | workers' CPU (s) | GPU busy | RSS (MiB) | GPU memory (GiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in parts.get("capacity", {}).get("levels", []):
        lines.append(f"| {r['streams']} | {'yes' if r['ok'] else 'no'} | {r['lag_p50_ms']} / {r['lag_p95_ms']} "
                     f"| {r['chunk_p95_ms']} | {r['steps']:.0f} | {r['chunks_per_step']} | "
                     + ", ".join(f"{k} {v}" for k, v in r["ms_per_step"].items())
                     + f" | {r['server_cpu_us_per_chunk']} | {r.get('workers_cpu_s', '-')} | {r.get('gpu_busy_pct', '-')}% "
                     f"| {r['rss_mib']} "
                     f"| {r.get('gpu_memory_gib', '-')} |")
    ceil = parts.get("ceiling", {})
    if ceil.get("ok"):
        lines += ["", "Eager step (ms) by batch, 160 ms mode: " + ", ".join(f"{b}: {ms}" for b, ms in ceil["step_ms"].items())]
    beam = parts.get("beam ceiling", {})
    if beam.get("ok"):
        lines += ["Beam-search decode (ms) by batch, streams with 10 key phrases: "
                  + ", ".join(f"{b}: {ms}" for b, ms in beam["decode_ms"].items())]
    for name in [n for n in parts if n == "graphs vs eager" or n.startswith("alone vs among")]:
        rec = parts[name]
        figures = {k: v for k, v in rec.items() if isinstance(v, dict)} or {"": rec}
        lines.append(f"{name}: " + "; ".join(f"{k} agreement {v.get('agreement')} of {v.get('tokens')} tokens"
                                             for k, v in figures.items()) if rec.get("ok") else f"{name}: {rec.get('error')}")
    prec = parts.get("precision", {})
    lines += ["", "| precision | worst token agreement with CPU float32 (NeMo fixtures) |", "|---|---|"]
    lines += [f"| {mode} | {value:.4f} |" for mode, value in prec.get("fixture_agreement", {}).items()]
    lines += ["", f"Tests: {parts.get('tests', {}).get('summary', parts.get('tests', {}).get('error'))}"]
    failed = [f"{name} ({rec.get('error')})" for name, rec in parts.items() if not rec.get("ok")]
    if failed:
        lines += ["", "Failed or skipped parts: " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

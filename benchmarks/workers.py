"""What the protocol work costs the engine's process, with the doors in it or in worker processes.

Runs the real server (`parakeet-serve --workers N` for each N given) on a model whose compute is
negligible (the tiny NeMo-made test fixture, converted here) under the TCP load client of
benchmarks/vs_parakeet_streaming (real-time clients, 80 ms packets), and reads from /proc the CPU
time of the engine's process and of the workers over the run. Per message (audio packets in plus
results out): the engine process's CPU microseconds, the workers', and the clients' p95 lag.

    python -m benchmarks.workers --clients 128 --workers 0 1 2
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from benchmarks.common import LOAD_CLIENT, RESULTS, ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "nemo" / "eou_tiny.nemo"
SENTENCE = ROOT / "tests" / "fixtures" / "audio" / "sentence.wav"
PACKET_S = 0.08  # the load client's packet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=128)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--seconds", type=float, default=10.0, help="audio per client (the fixture sentence, repeated)")
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_workers.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model, wav = prepare(Path(work), args.seconds)
        rows = [run(model, wav, n, args.clients) for n in args.workers]
    for row in rows:
        print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


def prepare(work: Path, seconds: float) -> tuple[Path, Path]:
    from parakeet_stream.tools.convert import convert

    convert(str(FIXTURE), work / "model")
    audio, rate = sf.read(SENTENCE, dtype="float32")
    audio = np.tile(audio, int(np.ceil(seconds * rate / len(audio))))[: int(seconds * rate)]
    sf.write(work / "speech.wav", audio, rate, subtype="PCM_16")
    return work / "model", work / "speech.wav"


def run(model: Path, wav: Path, workers: int, clients: int) -> dict:
    cmd = [sys.executable, "-m", "parakeet_stream.server.cli", "--model", str(model), "--workers", str(workers),
           "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "off", "--dtype", "float32",
           "--max-num-streams", str(clients + 8), "--log-level", "warning"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        ports = ready_ports(server)
        engine_pid, worker_pids = server.pid, children(server.pid)
        before = cpu(engine_pid), sum(cpu(p) for p in worker_pids)
        load = subprocess.run([sys.executable, *LOAD_CLIENT, "--port", str(ports["tcp"]), "--wav", str(wav),
                               "--clients", str(clients), "--procs", "2",
                               "--metrics", f"http://127.0.0.1:{ports['http']}/metrics"],
                              capture_output=True, text=True, check=True, cwd=ROOT)
        after = cpu(engine_pid), sum(cpu(p) for p in worker_pids)
    finally:
        server.terminate()
        server.wait(timeout=60)
    report = json.loads(load.stdout.strip().splitlines()[-1])
    audio_in = report["finished"] * int(np.ceil(report["audio_s"] / PACKET_S))
    results_out = report["finished"] * report["results_per_stream"]
    messages = audio_in + results_out
    engine_s, workers_s = after[0] - before[0], after[1] - before[1]
    return {
        "workers": workers, "clients": clients, "finished": report["finished"],
        "messages_in": audio_in, "results_out": results_out,
        "engine_process_cpu_s": round(engine_s, 2), "workers_cpu_s": round(workers_s, 2),
        "engine_process_us_per_message": round(engine_s / messages * 1e6, 1),
        "workers_us_per_message": round(workers_s / messages * 1e6, 1),
        "lag_p95_s": round(report["lag_p95"], 3),
        "chunk_p95_s": round(report.get("server_metrics", {}).get("chunk_p95", float("nan")), 3),
    }


def ready_ports(server: subprocess.Popen) -> dict[str, int]:
    for line in server.stdout:
        if line.startswith("parakeet-serve ready:"):
            return {k: int(v) for k, v in re.findall(r"(\w+)://127\.0\.0\.1:(\d+)", line)}
    raise RuntimeError("the server did not start")


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def cpu(pid: int) -> float:
    """User + system CPU seconds of a process (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()

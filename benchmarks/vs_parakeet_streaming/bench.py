"""Side-by-side driver: parakeet-stream ("ours", A) and parakeet-streaming ("ps", B) loaded at
once, only one ever runnable.

Both servers start with the same environment (OMP_NUM_THREADS as given, or unset) and the same
slot count; the one not under test is SIGSTOPped, so it takes no CPU. For each N, A then B run
the same load (loadgen.py, same seed). Then the N at each server's capacity edge (last pass and
first fail) are repeated, again A then B. Per trial: the loadgen summary, the server's CPU
seconds and its RSS (idle before, peak sampled every 0.25 s during, after).

    .venv/bin/python -m benchmarks.vs_parakeet_streaming.bench --out results/vs_parakeet_streaming/default.json

Everything it reads and writes is under the work folder that setup.sh filled: $BENCH_DIR, by
default results/vs_parakeet_streaming/ of this repository (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = Path(os.environ.get("BENCH_DIR", HERE.parents[1] / "results" / "vs_parakeet_streaming"))
NS = [1, 2, 4, 6, 8, 12, 16, 24, 32]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def nthreads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def loadavg():
    return open("/proc/loadavg").read().split()[:3]


class Server:
    def __init__(self, name, cmd, env, port, ready, metrics=None):
        self.name, self.port, self.metrics = name, port, metrics  # metrics: its Prometheus URL, if it has one
        self.log = open(WORK / f"{name}-server.log", "w")
        self.p = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while not ready(self):
            if self.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {self.log.name}")
            time.sleep(0.5)
        self.running = True

    def stop(self):
        if self.running:
            os.kill(self.p.pid, signal.SIGSTOP)
            self.running = False

    def cont(self):
        if not self.running:
            os.kill(self.p.pid, signal.SIGCONT)
            self.running = True

    def alive(self):
        return self.p.poll() is None

    def close(self):
        self.cont()
        self.p.terminate()
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)


def ours_ready(s):
    return "parakeet-serve ready" in Path(s.log.name).read_text()


def ps_ready(s):  # parakeet-streaming's status port answers one JSON line once the server is up
    try:
        with socket.create_connection(("127.0.0.1", s.port + 1), timeout=1) as c:  # status port = port+1
            return b"status" in c.recv(200)
    except OSError:
        return False


def run_load(server: Server, n: int, wav: str, seed: int, label: str):
    server.cont()
    time.sleep(1.0)
    pid = server.p.pid
    c0, r0 = cpu_s(pid), rss_mb(pid)
    peak = [r0]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.25):
            try:
                peak.append(rss_mb(pid))
            except (FileNotFoundError, TypeError):
                return

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "benchmarks.vs_parakeet_streaming.loadgen", "--port", str(server.port), "--wav", wav,
           "--clients", str(n), "--seed", str(seed), "--label", label,
           "--out", str(WORK / "results" / "streams" / f"{label}.json")] + (["--metrics", server.metrics] if server.metrics else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=HERE.parents[1])
        summ = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else \
            {"clients": n, "ok": False, "errors": [f"loadgen rc={out.returncode}: {out.stderr[-500:]}"]}
    except subprocess.TimeoutExpired:
        summ = {"clients": n, "ok": False, "errors": ["loadgen timeout"]}
    wall = time.monotonic() - t0
    time.sleep(1.0)  # let the server release the streams
    stop.set()
    th.join()
    alive = server.alive()
    summ.update(server=server.name, wall_s=round(wall, 1), alive=alive,
                server_cpu_s=round(cpu_s(pid) - c0, 1) if alive else None,
                rss_before_mb=round(r0), rss_peak_mb=round(max(p for p in peak if p)),
                rss_after_mb=round(rss_mb(pid)) if alive else None,
                threads=nthreads(pid) if alive else None, load=loadavg())
    server.stop()
    shown = {k: summ.get(k) for k in ("server", "clients", "ok", "lag_p50", "lag_p95", "over_max",
                                      "finished", "server_cpu_s", "rss_peak_mb", "errors")}
    if "server_metrics" in summ:  # what ours measured itself (loadgen --metrics)
        shown.update({k: summ["server_metrics"].get(k) for k in ("chunk_p95", "chunks_per_step")})
    print(json.dumps(shown), flush=True)
    return summ


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="default", help="'default' (OMP_NUM_THREADS unset) or a number")
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--wav", default=str(WORK / "audio" / "speech20.wav"))
    ap.add_argument("--warm-wav", default=str(WORK / "audio" / "sentence.wav"))
    ap.add_argument("--ours-model", default=str(WORK / "random-small"))
    ap.add_argument("--ps-weights", default=str(WORK / "ps-small"))
    ap.add_argument("--slots", type=int, default=64, help="--max-num-streams for both")
    ap.add_argument("--repeat-edges", type=int, default=1, help="extra runs of each capacity-edge N")
    ap.add_argument("--ours-args", default="", help='extra parakeet-serve flags, e.g. "--dtype bfloat16"')
    ap.add_argument("--out", default=str(WORK / "bench.json"), help="the results (JSON); see table.py")
    a = ap.parse_args()
    (WORK / "results" / "streams").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if a.threads != "default":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = a.threads
    tag = f"t{a.threads}"
    res = {"threads": a.threads, "ours_args": a.ours_args, "load_start": loadavg(), "trials": []}

    A = Server("ours", [str(WORK / "ours-venv/bin/parakeet-serve"), "--model", a.ours_model, "--device", "cpu",
                        "--host", "127.0.0.1", "--port", "18765", "--ws-port", "18000", "--http-port", "18080",
                        "--max-num-streams", str(a.slots), *shlex.split(a.ours_args)], env, 18765, ours_ready,
               metrics="http://127.0.0.1:18080/metrics")
    A.stop()
    B = Server("ps", [str(WORK / "ps-venv/bin/parakeet-server"), "serve", "--device", "cpu", "--host", "127.0.0.1",
                      "--port", "28765", "--ws-port", "28000", "--status-port", "28766", "--model-size", "small",
                      "--max-num-streams", str(a.slots)], dict(env, PS_WEIGHTS_DIR=a.ps_weights), 28765, ps_ready)
    B.stop()
    servers = [A, B]
    try:
        for s in servers:  # idle footprint: RSS and CPU burned in 10 s with no client
            s.cont()
            time.sleep(2)
            c0 = cpu_s(s.p.pid)
            time.sleep(10)
            res[f"{s.name}_idle"] = {"rss_mb": round(rss_mb(s.p.pid)), "cpu_s_per_10s": round(cpu_s(s.p.pid) - c0, 2),
                                     "threads": nthreads(s.p.pid)}
            s.stop()
            run_load(s, 1, a.warm_wav, 99, f"{tag}-warm-{s.name}")  # warm-up, not reported
        for s in servers:
            s.cont()
            time.sleep(1)
            res[f"{s.name}_idle"]["rss_after_warmup_mb"] = round(rss_mb(s.p.pid))
            s.stop()
        ns = [int(x) for x in a.ns.split(",")]
        fails = {s.name: 0 for s in servers}
        for n in ns:
            for s in servers:
                # skip a hopeless N (two consecutive fails with p95 lag > 2 s) except the largest
                if fails[s.name] >= 2 and n != ns[-1]:
                    res["trials"].append({"server": s.name, "clients": n, "skipped": True})
                    continue
                if not s.alive():
                    res["trials"].append({"server": s.name, "clients": n, "dead": True})
                    continue
                t = run_load(s, n, a.wav, n, f"{tag}-{s.name}-n{n}")
                t["pass"] = 1
                res["trials"].append(t)
                bad = not t.get("ok") and (t.get("lag_p95") is None or t["lag_p95"] > 2)
                fails[s.name] = fails[s.name] + 1 if bad else 0
        # repeat the capacity edges
        edges = set()
        for s in servers:
            done = [t for t in res["trials"] if t["server"] == s.name and "ok" in t]
            ok = [t["clients"] for t in done if t["ok"]]
            cap = max(ok) if ok else None
            edges.add(cap or ns[0])
            above = [n for n in ns if cap is None or n > cap]
            if above:
                edges.add(above[0])
        res["edges"] = sorted(edges)
        for rep in range(a.repeat_edges):
            for n in sorted(edges):
                for s in servers:
                    if s.alive():
                        t = run_load(s, n, a.wav, 1000 + n, f"{tag}-{s.name}-n{n}-r{rep + 2}")
                        t["pass"] = rep + 2
                        res["trials"].append(t)
    finally:
        for s in servers:
            res[f"{s.name}_alive_at_end"] = s.alive()
            s.close()
        res["load_end"] = loadavg()
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

"""scripts/gpu_check.sh --dry-run: the GPU check's code, on CPU at tiny sizes, so it does not rot
before the GPU machine it is for runs it."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import types
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_check_runs_every_part_on_cpu(tmp_path):
    # no wheels: those of scripts/gpu_wheels.sh are for the GPU machine's Python, not this one
    env = os.environ | {"PYTHON": os.environ.get("PYTHON", sys.executable), "GPU_WHEELS": str(tmp_path / "none")}
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), "--dry-run", "--out", str(tmp_path / "check"),
                           "--work", str(tmp_path / "models")], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "check.json").read_text())
    parts = report["parts"]
    assert report["dry_run"] and not [name for name, rec in parts.items() if not rec["ok"]]
    start, capacity = parts["server start"], parts["capacity"]
    assert start["ready_seconds"] > 0 and start["engine_start"]["cuda_graphs"] == 0  # CPU: no graphs
    assert start["workers"] == 1  # the doors in a worker process, as on a GPU machine (there: auto)
    levels = capacity["levels"]
    assert [lv["streams"] for lv in levels][:1] == [2] and all(lv["finished"] == lv["streams"] for lv in levels)
    assert all(lv["steps"] > 0 and lv["server_cpu_us_per_chunk"] > 0 and lv["ms_per_step"]["encode"] > 0 for lv in levels)
    assert sum(lv["workers_cpu_s"] for lv in levels) > 0  # the protocol work, counted apart
    assert capacity["capacity"] in [lv["streams"] for lv in levels if lv["ok"]] + [0]
    assert parts["graphs vs eager"]["equal"] and parts["graphs vs eager"]["eager_calls"] == 0
    assert parts["ceiling"]["step_ms"] and parts["alone vs among float32"]["among 3"]["tokens"] > 0
    assert set(parts["beam ceiling"]["decode_ms"]) == set(parts["ceiling"]["step_ms"])
    assert parts["precision"]["fixture_agreement"] == {"float32": 1.0}
    verdict = [line for line in proc.stdout.splitlines() if line.startswith("gpu_check verdict: capacity ")]
    assert verdict and "streams at p95 <= 320 ms (chunk p95 " in verdict[-1] and ", start-up " in verdict[-1]
    table = (tmp_path / "check.md").read_text()
    assert "| streams | held | lag p50 / p95 (ms) |" in table and verdict[-1] in table
    assert "engine ready in" in (tmp_path / "check-server.log").read_text()  # the server's log beside the report
    assert list(start["engine_start"]["phases"]) == ["load", "precision", "memory", "pools", "capture"]
    assert parts["start-up, one mode"]["ready_seconds"] > 0 and "serving one mode, ready in" in table


def test_py_spy_files_are_bundled_into_one(tmp_path, monkeypatch):
    from scripts import gpu_check

    for name in ("server-64.txt", "server-256.txt", "server-256-stalled.txt"):
        (tmp_path / name).write_text(name)
    gpu_check.bundle_profiles(tmp_path / "check")
    with tarfile.open(tmp_path / "check-profiles.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["server-256-stalled.txt", "server-256.txt", "server-64.txt"]
        assert tar.extractfile("server-64.txt").read() == b"server-64.txt"
    assert not list(tmp_path.glob("server-*.txt"))


def test_the_gpu_check_installs_carried_wheels_before_it_runs(tmp_path):
    """What scripts/gpu_wheels.sh leaves in .whl/ is importable by the check, without a network."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "probe_pkg-0.1-py3-none-any.whl", "w") as whl:
        whl.writestr("probe_pkg/__init__.py", "")
        whl.writestr("probe_pkg-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: probe-pkg\nVersion: 0.1\n")
        whl.writestr("probe_pkg-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr("probe_pkg-0.1.dist-info/RECORD", "")
    python = tmp_path / "python"  # pip runs as asked; in place of the check, the import it depends on
    python.write_text(f'#!/bin/bash\n[ "$1" = -m ] && [ "$2" = pip ] && exec {sys.executable} "$@"\n'
                      f'exec {sys.executable} -c "import probe_pkg; print(probe_pkg.__file__)"\n')
    python.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh")], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"PYTHON": str(python), "GPU_WHEELS": str(wheels), "PIP_NO_INDEX": "1"})
    assert proc.returncode == 0, proc.stderr
    where = Path(proc.stdout.strip())
    assert where.name == "__init__.py" and wheels not in where.parents and where.parent.parent != ROOT


def test_the_wheel_fetcher_refuses_a_bad_python_version_before_touching_anything():
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_wheels.sh"), "banana"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "the GPU machine's Python version, e.g. 3.12; got 'banana'" in proc.stderr


def test_a_stalled_server_is_named_in_the_verdict_and_the_gpu_parts_after_it_are_skipped(tmp_path, monkeypatch):
    """A kernel that never ends outlives the server's process: every later GPU figure would be wrong."""
    from scripts import gpu_check

    stall = {"stage": "decode", "thread": "decode", "seconds": 16.2, "streams": 40,
             "batches": ["(70, 1) x 40"], "device_at": "encode (70, 1) x 40"}

    class Stalling:  # the server's /health: fine once, then stalled
        answers = iter([{"stalled": None}])

        def health(self):
            return next(self.answers, {"stalled": stall})

    with gpu_check.HealthWatch(Stalling()) as watch:
        time.sleep(1.5)  # one look during the level
    assert watch.stall == stall
    report = gpu_check.Report(time.monotonic() + 600, tmp_path / "check", dry_run=True)
    report.stalled = gpu_check.describe_stall(256, stall)
    report.part("machine", lambda: {"gpu": "none"})
    report.part("ceiling", lambda: pytest.fail("a part after a stall must not run"), needs=30)
    assert report.parts["machine"]["ok"] and not report.parts["ceiling"]["ok"]
    assert "the server stalled (at 256 streams, decode on one step for 16.2 s" in report.parts["ceiling"]["error"]
    report.parts["capacity"] = {"ok": True, "capacity": 128, "at_least": False, "chunk_p95_ms": 49.2,
                                "stalled": report.stalled, "levels": []}
    assert gpu_check.verdict(report.parts).endswith(
        "; STALLED at 256 streams, decode on one step for 16.2 s (batches (70, 1) x 40, the GPU not past: "
        "encode (70, 1) x 40)")


def test_the_check_reads_a_stalled_servers_503_health(monkeypatch):
    """/health answers 503 while the engine is stalled: its body is what names the stall."""
    from scripts import gpu_check

    body = json.dumps({"status": "broken", "stalled": {"stage": "decode"}}).encode()

    class Broken(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Broken) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        server = types.SimpleNamespace(http=f"http://127.0.0.1:{httpd.server_port}")
        assert gpu_check.Server.health(server)["stalled"] == {"stage": "decode"}
        httpd.shutdown()

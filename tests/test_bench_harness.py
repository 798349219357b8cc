"""The side-by-side harness's load client against a real server: its own figures and the server's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.common import LOAD_CLIENT
from helpers import ServerProcess, audio_file

ROOT = Path(__file__).resolve().parent.parent
HOST = ["-m", "benchmarks.host"]  # the host-path benchmark, run from ROOT


@pytest.fixture
def server(tiny_model_dir):
    server = ServerProcess(tiny_model_dir, "--max-num-streams", "4")
    yield server
    server.close()


def write_wav(path: Path, samples: np.ndarray) -> Path:
    path.write_bytes(audio_file(samples))
    return path


def loadgen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *LOAD_CLIENT, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_load_client_reports_the_servers_chunk_latency_and_steps(server, engine, sentence, tmp_path):
    """`engine` runs the server's model: its chunk length says how many chunks the server counts."""
    wav = write_wav(tmp_path / "sentence.wav", sentence)
    metrics = f"http://127.0.0.1:{server.ports['http']}/metrics"
    out = loadgen("--port", str(server.ports["tcp"]), "--wav", str(wav), "--clients", "2", "--metrics", metrics)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["finished"] == 2 and not summary["errors"]
    figures = summary["server_metrics"]
    expected = 2 * np.ceil(len(sentence) / 16000 / engine.chunk_seconds())
    assert expected - 2 <= figures["chunks"] <= expected + 2  # each stream's chunks, within one at its end
    assert 0 < figures["chunk_p50"] <= figures["chunk_p95"]
    assert 0 <= figures["chunk_share_le_320ms"] <= 1
    # every chunk's result has a latency; the encoder also ran each stream's partial last chunk
    assert figures["chunks"] <= figures["chunks_encoded"] <= figures["chunks"] + 2
    assert 1 <= figures["steps"] <= figures["chunks_encoded"] + 2  # a stream's final may be a step of its own
    assert figures["chunks_per_step"] == figures["chunks_encoded"] / figures["steps"]
    assert all(figures[f"ms_per_step_{stage}"] > 0 for stage in ("pre-encode", "encode", "decode"))


def test_the_load_client_refuses_a_bad_metrics_url_or_wav_in_one_line(sentence, tmp_path):
    wav = write_wav(tmp_path / "sentence.wav", sentence)
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cases = [(["--wav", str(wav), "--metrics", "localhost:8080"], "--metrics: must be an http:// or https:// URL"),
             (["--wav", str(wav), "--metrics", f"http://127.0.0.1:{port}/metrics"], "cannot read the server's metrics at"),
             (["--wav", str(tmp_path / "missing.wav")], "cannot read --wav"),
             (["--wav", str(wav), "--procs", "0"], "--procs: must be a whole number of at least 1")]
    for args, message in cases:
        out = loadgen("--port", str(port), *args)
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_the_load_client_spread_over_processes_runs_every_stream_once(server, sentence, tmp_path):
    wav = write_wav(tmp_path / "sentence.wav", sentence)
    out = loadgen("--port", str(server.ports["tcp"]), "--wav", str(wav), "--clients", "3", "--procs", "2",
                  "--out", str(tmp_path / "trial.json"))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["finished"] == 3 and not summary["errors"] and summary["client_cpu_s"] > 0
    streams = json.loads((tmp_path / "trial.json").read_text())["streams"]
    assert [s["id"] for s in streams] == [0, 1, 2] and all(s["token_ids"] and s["fin_lag_s"] >= 0 for s in streams)


def test_the_load_client_as_admitted_starts_a_queued_stream_when_it_is_let_in(tiny_model_dir, sentence, tmp_path):
    server = ServerProcess(tiny_model_dir, "--max-num-streams", "1")
    try:
        wav = write_wav(tmp_path / "sentence.wav", sentence)
        out = loadgen("--port", str(server.ports["tcp"]), "--wav", str(wav), "--clients", "2", "--as-admitted")
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["finished"] == 2 and not summary["connect_failures"] and summary["admitted_at_once"] == 1
    assert summary["queued_hello_max"] >= len(sentence) / 16000 * 0.9  # it waited for the first to end


def test_the_host_benchmark_refuses_a_bad_device_time_in_one_line():
    for bad in ("banana", "9", "-1,0.5"):
        out = subprocess.run([sys.executable, *HOST, "--device-ms", bad], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2 and "--device-ms:" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_the_host_benchmark_refuses_bad_packet_sizes_in_one_line():
    for bad in ("x", "20", "0,5", "160,20"):
        out = subprocess.run([sys.executable, *HOST, "--packet-ms", bad], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2 and "--packet-ms:" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_the_host_benchmark_refuses_a_count_below_one_in_one_line():
    for args in (["--lockstep", "0"], ["--lockstep", "-3"], ["--lockstep", "x"], ["--streams", "0"]):
        out = subprocess.run([sys.executable, *HOST, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2 and f"{args[0]}:" in out.stderr and "at least 1" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_the_host_benchmarks_lockstep_makes_each_round_one_step_and_answers_every_chunk(tmp_path):
    out = subprocess.run([sys.executable, *HOST, "--streams", "8", "--lockstep", "3", "--device-ms", "0,0",
                          "--out", str(tmp_path / "lockstep.json")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    (level,) = json.loads((tmp_path / "lockstep.json").read_text())["lockstep"]
    assert (level["streams"], level["chunks"], level["steps"]) == (8, 24, 3)
    assert set(level["stage_us_per_chunk"]) == {"pre-encode", "encode", "decode", "results"}
    assert all(v > 0 for v in level["stage_us_per_chunk"].values()) and level["cpu_us_per_chunk"] > 0
    if sys.platform.startswith("linux"):  # each thread's CPU, from /proc: the driver's and the stages' own
        threads = level["thread_cpu_us_per_chunk"]
        assert {"MainThread", "pre-encode", "decode"} <= set(threads) and threads["pre-encode"] > 0


def test_the_host_benchmark_on_meta_tensors_answers_every_chunk_and_counts_no_tensor_arithmetic(tmp_path):
    """`--tensors meta`: the engine's tensors hold shapes only, so a step costs the host what a GPU's
    launches would; every chunk is still cut, decoded and answered."""
    for tensors in ("cpu", "meta"):
        out = subprocess.run([sys.executable, *HOST, "--streams", "64", "--lockstep", "3", "--device-ms", "0,0",
                              "--tensors", tensors, "--out", str(tmp_path / f"{tensors}.json")],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        report = json.loads((tmp_path / f"{tensors}.json").read_text())
        (level,) = report["lockstep"]
        assert report["tensors"] == tensors and (level["chunks"], level["steps"]) == (192, 3)


def test_the_host_benchmark_through_the_service_counts_the_engine_process_and_its_service_threads(tmp_path):
    """`--service`: the streams come from a child process through the engine client API; every
    chunk is answered there, and the engine process's figures include its service threads."""
    out = subprocess.run([sys.executable, *HOST, "--streams", "6", "--seconds", "1.5", "--service",
                          "--out", str(tmp_path / "service.json")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "service.json").read_text())
    (level,) = report["levels"]
    assert report["service"] and level["streams"] == 6 and level["chunks"] >= 6 * 8  # 1.5 s of 160 ms chunks each
    assert level["cpu_us_per_chunk"] > 0 and level["time_to_final_p95_ms"] is not None
    if sys.platform.startswith("linux"):
        threads = level["thread_cpu_us_per_chunk"]
        assert {"engine-service-read", "engine-service-write", "pre-encode"} <= set(threads)
        assert threads["engine-service-read"] > 0

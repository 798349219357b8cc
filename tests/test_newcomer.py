"""A newcomer's first commands: one-line errors, the configuration dump, parakeet-bench's defaults
and its lag definition (issue 13's polish list)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_server_support import ServerProcess

from parakeet_stream.tools.bench import ClientRecord, sent_at

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = ROOT / "tests" / "fixtures" / "audio" / "sentence.wav"
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only torch (or no GPU)")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env or dict(os.environ))


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_transcribe_a_directory_says_so(tiny_model_dir, tmp_path):
    result = run("parakeet_stream.tools.transcribe", str(tmp_path), "--model", str(tiny_model_dir))
    assert result.returncode == 1
    assert one_line(result.stderr) == (f"{tmp_path}: error: cannot read audio file {tmp_path}: it is a directory "
                                       f"(pass the files in it, e.g. {tmp_path}/*.wav)")


@cpu_only
@pytest.mark.parametrize("module", ["parakeet_stream.tools.transcribe", "parakeet_stream.server.cli"])
def test_cuda_on_cpu_only_torch_is_one_line(module, tiny_model_dir):
    args = [str(SENTENCE)] if module.endswith("transcribe") else ["--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0"]
    result = run(module, *args, "--model", str(tiny_model_dir), "--device", "cuda")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.endswith("error: --device cuda: " + (
        f"this torch {torch.__version__} is a CPU-only build (install a CUDA build of torch, or use --device cpu)"
        if not torch.backends.cuda.is_built() else "no CUDA GPU is visible to torch (use --device cpu)")), line


def test_configuration_dump_shows_the_lookahead_in_use(tiny_model_dir, eou_model):
    server = ServerProcess(tiny_model_dir)
    try:
        left, right = eou_model.cfg.default_lookahead
        assert f"  lookahead = {left},{right}\n" in server.config_lines
    finally:
        server.close()


def test_lag_counts_from_the_packet_that_held_the_audio():
    record = ClientRecord(packet_ms=80)
    # packet k (80 ms) leaves at k * 80 ms: a result covering 0.5 s needs packet 6 (0.48-0.56 s)
    assert sent_at(10.0, 11.0, 0.5, record, seconds=2.0) == pytest.approx(10.48)
    assert sent_at(10.0, 11.0, 0.48, record, seconds=2.0) == pytest.approx(10.40)  # its last sample is in packet 5
    assert sent_at(10.0, 13.0, 5.0, record, seconds=2.0) == pytest.approx(11.92)  # padding past the end: last packet
    # frames counted past the samples sent so far: the latest packet sent, never after `now`
    assert sent_at(10.0, 10.5, 0.6, record, seconds=2.0) == pytest.approx(10.48)


def test_bench_defaults_and_no_matplotlib(tiny_model_dir, tmp_path):
    """The README's command (no --audio) works, lag is never negative, and without matplotlib the
    JSON is written and one line says how to get the plot."""
    blocker = tmp_path / "no_matplotlib" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib is hidden by the test')\n")
    server = ServerProcess(tiny_model_dir)
    try:
        out = tmp_path / "bench"
        env = dict(os.environ, PYTHONPATH=str(blocker.parent))
        result = run("parakeet_stream.tools.bench", "--url", server.url("tcp"), "--clients", "1,2", "--seconds", "3",
                     "--out", str(out), env=env)
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert f"parakeet-bench: no plot ({out}.png): it needs matplotlib: pip install -e '.[bench]'" in result.stderr
    report = json.loads(out.with_suffix(".json").read_text())
    assert not out.with_suffix(".png").exists()
    for level in report["levels"]:
        assert level["results"] > 0 and level["finals"] == level["clients"]
        assert level["lag_ms"]["p50"] >= 0 and min(level["lag_ms"].values()) >= 0, level
    assert re.search(r'"capacity": \d+', result.stdout)

"""A newcomer's first commands: one-line errors, the configuration dump, --help, parakeet-bench's
defaults, its lag definition and its capacity wording, HTTP status lines, the `stopped` line."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from helpers import ServerProcess

from parakeet_stream.audio import AudioError, read_audio
from parakeet_stream.engine.options import default_slots
from parakeet_stream.model.config import ModelConfig
from parakeet_stream.server.cli import build_parser
from parakeet_stream.tools.bench import ClientRecord, capacity, capacity_at_least, capacity_text, sent_at
from parakeet_stream.tools.bench import build_parser as bench_parser

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = ROOT / "tests" / "fixtures" / "audio" / "sentence.wav"
HELP = "; see parakeet-serve --help"
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
    assert one_line(result.stderr) == (f"parakeet-transcribe: error: cannot read audio file {tmp_path}: it is a "
                                       f"directory (pass the files in it, e.g. {tmp_path}/*.wav)")


def test_transcribe_error_names_the_file_once(tiny_model_dir):
    result = run("parakeet_stream.tools.transcribe", "README.md", "--model", str(tiny_model_dir))
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith("parakeet-transcribe: error: cannot read audio file README.md: ") and \
        line.count("README.md") == 1, line


@pytest.mark.parametrize("offline", [False, True])
@pytest.mark.parametrize("kind, words", [("empty", "the file is empty"), ("header", "the file contains no audio")])
def test_an_empty_file_gets_the_same_words_from_every_reader(tiny_model_dir, tmp_path, offline, kind, words):
    """read_audio (the --offline path, the examples) said "format not recognised" for an empty file."""
    path = tmp_path / f"{kind}.wav"
    if kind == "empty":
        path.touch()
    else:
        sf.write(path, np.zeros(0, np.float32), 16000)
    with pytest.raises(AudioError) as read:
        read_audio(path)
    assert str(read.value) == f"cannot read audio file {path}: {words}"
    result = run("parakeet_stream.tools.transcribe", str(path), "--model", str(tiny_model_dir), *(["--offline"] if offline else []))
    assert result.returncode == 1 and one_line(result.stderr) == f"parakeet-transcribe: error: {read.value}"


def test_transcribe_json_times_in_milliseconds(tiny_model_dir):
    result = run("parakeet_stream.tools.transcribe", str(SENTENCE), "README.md", "--model", str(tiny_model_dir),
                 "--json")
    assert result.returncode == 1
    good, bad = map(json.loads, result.stdout.splitlines())
    assert good["token_times"] and good["token_times"] == [round(t, 3) for t in good["token_times"]]
    assert not re.search(r"\d\.\d{4,}", result.stdout.splitlines()[0]), result.stdout  # no float noise
    assert bad["file"] == "README.md" and bad["error"].count("README.md") == 1, bad


@pytest.mark.skipif((ROOT / "weights" / "small" / "config.json").is_file(), reason="weights/small is converted here")
@pytest.mark.parametrize("module", ["parakeet_stream.tools.transcribe", "parakeet_stream.server.cli"])
def test_named_model_offline_suggests_demo(module, tmp_path):
    args = [str(SENTENCE)] if module.endswith("transcribe") else ["--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    result = run(module, *args, "--model", "small", env=env | {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "HF_HUB_OFFLINE" in line and line.endswith("; --model demo (the bundled demo model) needs no network"), line


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
        modes = " ".join(f"{a},{b}" for a, b in eou_model.cfg.encoder.att_context_sizes)  # every mode: none chosen
        assert f"  lookahead_modes = {modes}\n" in server.config_lines
    finally:
        server.close()


def test_served_lookahead_modes_from_the_flag_or_its_variable_and_a_bad_one_in_one_line(monkeypatch, capsys,
                                                                                        tiny_model_dir):
    assert build_parser().parse_args(["--lookahead-modes", "70,1 70,13"]).lookahead_modes == ((70, 1), (70, 13))
    monkeypatch.setenv("PARAKEET_LOOKAHEAD_MODES", "70,6")
    assert build_parser().parse_args([]).lookahead_modes == ((70, 6),)
    for bad in ("70", "", "70,1 x"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["--lookahead-modes", bad])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].startswith("parakeet-serve: error: argument --lookahead-modes:")
    monkeypatch.delenv("PARAKEET_LOOKAHEAD_MODES")
    result = run("parakeet_stream.server.cli", "--model", str(tiny_model_dir), "--lookahead-modes", "70,5",
                 "--dtype", "float32", "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0")
    assert result.returncode == 2
    assert one_line(result.stderr).startswith("parakeet-serve: error: lookahead 70,5 is not one of this model's modes")


@pytest.mark.parametrize("where", ["folder", "hub cache"])
def test_a_lookahead_the_model_lacks_is_refused_before_its_weights_load(where, tiny_model_dir, tmp_path, monkeypatch,
                                                                       capsys):
    """Its config.json names its modes: neither parakeet-serve nor parakeet-transcribe loads the weights to refuse
    it (a hub model in the cache with weights that cannot load shows it)."""
    from parakeet_stream.server import cli
    from parakeet_stream.tools import transcribe

    model = str(tiny_model_dir)
    if where == "hub cache":
        monkeypatch.setenv("HF_HOME", str(tmp_path))
        repo = tmp_path / "parakeet-stream" / "models--acme--tiny"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        (repo / ("0" * 40)).mkdir()
        for name in ("config.json", "tokenizer.model"):
            (repo / ("0" * 40) / name).write_bytes((tiny_model_dir / name).read_bytes())
        (repo / ("0" * 40) / "model.safetensors").write_text("not weights")
        model = "acme/tiny"
    monkeypatch.setattr(cli, "ASREngine", None)  # never reached
    monkeypatch.setattr(transcribe, "load_model", None)
    monkeypatch.setattr(transcribe, "single_threaded_host", lambda: None)  # this process's torch threads stay
    modes = ", ".join(f"{a},{b}" for a, b in ModelConfig.load(tiny_model_dir / "config.json").encoder.att_context_sizes)
    refusal = f"lookahead 13,4 is not one of this model's modes ({modes})"
    for flag in ("--lookahead", "--lookahead-modes"):
        assert cli.main(["--model", model, flag, "13,4", "--port", "0", "--ws-port", "0", "--http-port", "0",
                         "--grpc-port", "0"]) == 2
        assert one_line(capsys.readouterr().err) == f"parakeet-serve: error: {refusal}"
    assert transcribe.main([str(SENTENCE), "--model", model, "--lookahead", "13,4"]) == 2
    assert one_line(capsys.readouterr().err) == f"parakeet-transcribe: error: {refusal}"


def test_slots_default_to_what_memory_holds_on_a_gpu_and_to_64_on_a_cpu(tiny_model_dir):
    assert default_slots("cpu") == 64 and default_slots("cuda") == default_slots("cuda:1") == "auto"
    server = ServerProcess(tiny_model_dir)
    try:
        assert "  max_num_streams = 64\n" in server.config_lines
    finally:
        server.close()
    server = ServerProcess(tiny_model_dir, "--max-num-streams", "auto")
    try:
        (line,) = [line for line in server.config_lines if "max_num_streams" in line]
        assert re.fullmatch(r"  max_num_streams = auto \(\d+\)\n", line), line
    finally:
        server.close()


def test_help_shows_defaults_and_where_things_are():
    serve_help = " ".join(build_parser().format_help().split())  # argparse wraps lines
    for text in ("--port PORT raw TCP port, newline-delimited JSON (0: any free) (default: 8765)",
                 "(default: 8000)", "the live captions page (open http://HOST:PORT/)", "(default: 8080)",
                 "scripts/serve.sh passes --model small (default: demo)", "(default: 127.0.0.1)",
                 "a second Ctrl-C stops at once"):
        assert text in serve_help, text
    assert "(default: None)" not in serve_help
    bench_help = " ".join(bench_parser().format_help().split())
    assert "--clients N[,N...] concurrent clients of each level" in bench_help and "(default: 1,2,4,8)" in bench_help


@pytest.mark.parametrize("within, text", [([True, True, True], "at least 4"), ([True, True, False], "2"),
                                          ([False, True, False], "2"), ([False, False, False], "0")])
def test_capacity_at_the_highest_level_tried_is_a_lower_bound(within, text):
    levels = [{"clients": n, "within_budget": ok} for n, ok in zip((1, 2, 4), within)]
    report = {"capacity": capacity(levels), "capacity_at_least": capacity_at_least(levels)}
    assert capacity_text(report) == text


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
    summary = json.loads(result.stdout)
    if summary["capacity"] == 2:  # both levels within budget: the server may hold more than was tried
        assert summary["capacity_at_least"] and "parakeet-bench: capacity at least 2 streams" in result.stderr


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    server = ServerProcess(tiny_model_dir, "--log-level", "info")
    yield server
    server.close()


def status_line(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0].decode()


def test_http_status_lines_have_a_reason_phrase(tiny_server):
    http = tiny_server.ports["http"]
    assert status_line(http, "/health") == "HTTP/1.1 200 OK"
    assert status_line(http, "/no-such-page") == "HTTP/1.1 404 Not Found"


def test_sigterm_drains_and_says_stopped(tiny_model_dir):
    server = ServerProcess(tiny_model_dir)
    try:
        assert server.terminate() == 0
        assert server.proc.stdout.read().splitlines() == ["parakeet-serve stopped (drained)"]
    finally:
        server.close()


def test_second_ctrl_c_stops_at_once_and_says_so(tiny_model_dir):
    server = ServerProcess(tiny_model_dir, "--log-level", "info", "--drain-timeout", "60")
    try:
        with socket.create_connection(("127.0.0.1", server.ports["tcp"]), timeout=10) as client:
            assert json.loads(client.makefile().readline())["type"] == "hello"  # an active stream holds the drain
            server.proc.send_signal(signal.SIGINT)
            for line in server.proc.stderr:
                if line.rstrip().endswith("SIGINT: draining"):
                    break
            server.proc.send_signal(signal.SIGINT)
            assert server.proc.wait(timeout=30) == 0
        assert server.proc.stdout.read().splitlines() == ["parakeet-serve stopped (not drained)"]
        rest = server.proc.stderr.read()  # both said in the log: the cut, and why the connection ended
        assert "SIGINT again: stopping now (open connections cut: 1)" in rest
        assert re.search(r"connection closed peer=\S+ door=tcp protocol=native reason=server_shutdown", rest), rest
    finally:
        server.close()


@pytest.mark.parametrize("flag, value", [("--port", "70000"), ("--ws-port", "99999"), ("--http-port", "65536"),
                                         ("--port", "-5"), ("--grpc-port", "70000"), ("--agent-port", "65536")])
def test_a_port_out_of_range_is_refused_in_one_line(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([flag, value])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"parakeet-serve: error: argument {flag}: {int(value)} is not a "
                                                        f"port: ports are 0 (any free one) to 65535{HELP}")


@pytest.mark.parametrize("module, args, line", [
    ("parakeet_stream.server.cli", ["--port", "abc"], "parakeet-serve: error: argument --port: 'abc' is not a port number"),
    ("parakeet_stream.server.cli", ["--dtype", "float64"], "parakeet-serve: error: argument --dtype: invalid choice: "
                                                           "'float64' (choose from 'auto', 'float32', 'bfloat16', 'float16')"),
    ("parakeet_stream.server.cli", ["--diarizer-latency", "0.5"], "parakeet-serve: error: argument --diarizer-latency: "
                                                                   "invalid choice: 0.5 (choose from 0.32, 1.04)"),
    ("parakeet_stream.server.cli", ["--lookahead", "99"],
     "parakeet-serve: error: argument --lookahead/--att-context-size: expected 'L,R' such as 70,1, got '99'"),
    ("parakeet_stream.tools.transcribe", [], "parakeet-transcribe: error: the following arguments are required: FILE"),
    ("parakeet_stream.tools.convert", [], "parakeet-convert: error: the following arguments are required: src"),
    ("parakeet_stream.tools.bench", ["--clients", "x"], "parakeet-bench: error: argument --clients: client counts of at "
                                                        "least 1, comma-separated such as 1,2,4,8, got 'x'")])
def test_a_mistake_in_the_arguments_is_one_line_without_the_usage(module, args, line):
    """The usage (27 lines for parakeet-serve) used to come first and bury the line that says what is wrong."""
    result = run(module, *args)
    prog = line.split(":")[0]
    assert result.returncode == 2 and one_line(result.stderr) == f"{line}; see {prog} --help"


@pytest.mark.parametrize("flag, value, counts, least", [
    ("--max-num-streams", "0", "slots or 'auto'", 1), ("--max-num-streams", "-3", "slots or 'auto'", 1),
    ("--max-num-streams", "many", "slots or 'auto'", 1), ("--max-queue", "-2", "queue places", 0),
    ("--max-queue", "1.5", "queue places", 0)])
def test_slot_and_queue_counts_below_their_least_are_refused_in_one_line(flag, value, counts, least, capsys):
    """0 slots started a server that queued every stream forever; -3 failed with a traceback."""
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([flag, value])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"parakeet-serve: error: argument {flag}: must be a whole number of {counts}, at least {least}, got {value!r}"
        f"{HELP}")
    assert build_parser().parse_args([flag, "auto" if least else "0"])  # the least, or auto, still parses


def test_the_websocket_example_says_when_its_stream_ended_without_the_final_result(tiny_model_dir):
    server = ServerProcess(tiny_model_dir)
    try:
        client = subprocess.Popen([sys.executable, str(ROOT / "examples" / "ws_client.py"),
                                   str(ROOT / "examples" / "journey.wav"), server.url("ws")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while active_streams(server) == 0 and time.monotonic() < deadline:  # it streams at real time
            time.sleep(0.05)
        server.proc.kill()
        _, stderr = client.communicate(timeout=30)
    finally:
        server.close()
    assert client.returncode == 1
    assert "the connection ended without the final result: the text above is incomplete" in stderr


@pytest.mark.parametrize("example", ["tcp_client", "ws_client", "deepgram_client", "flux_client", "riva_client",
                                     "openai_realtime_client"])
def test_an_example_given_a_missing_or_empty_file_says_so_in_one_line(example, tmp_path):
    """They printed libsndfile's traceback; no server is needed to get this far."""
    empty = tmp_path / "empty.wav"
    empty.touch()
    for path, reason in ((tmp_path / "missing.wav", "no such file"), (empty, "the file is empty")):
        result = subprocess.run([sys.executable, str(ROOT / "examples" / f"{example}.py"), str(path)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 1 and one_line(result.stderr) == f"error: cannot read audio file {path}: {reason}"


def active_streams(server: ServerProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['http']}/health", timeout=5) as answer:
        return json.loads(answer.read())["active"]


def test_options_come_from_parakeet_variables_and_flags_win(monkeypatch):
    monkeypatch.setenv("PARAKEET_HOST", "0.0.0.0")
    monkeypatch.setenv("PARAKEET_DRAIN_TIMEOUT", "60")
    monkeypatch.setenv("PARAKEET_LOOKAHEAD", "70,6")  # the first of an option's names
    monkeypatch.setenv("PARAKEET_GRPC_PORT", "off")
    monkeypatch.setenv("PARAKEET_PORT", "not a port")  # not read: the command line sets --port
    monkeypatch.setenv("PARAKEET_API_KEY", "")  # empty: unset
    monkeypatch.setenv("PARAKEET_CHECK", "1")  # options without a value are flags only
    args = build_parser().parse_args(["--drain-timeout", "5", "--port=9"])
    assert (args.host, args.drain_timeout, args.lookahead, args.grpc_port, args.port) == ("0.0.0.0", 5.0, (70, 6), None, 9)
    assert args.api_key is None and not args.check


def test_a_bad_variable_is_refused_in_one_line_that_names_it(monkeypatch, capsys):
    monkeypatch.setenv("PARAKEET_LOG_LEVEL", "loud")
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("parakeet-serve: error: argument --log-level: invalid choice: 'loud' (choose from ")
    assert line.endswith(f" (from PARAKEET_LOG_LEVEL){HELP}")


def test_workers_without_a_writable_temporary_folder_are_refused_before_the_model_loads(monkeypatch, capsys):
    from parakeet_stream.server import cli

    def no_folder():
        raise FileNotFoundError("No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(cli.tempfile, "gettempdir", no_folder)
    monkeypatch.setattr(cli, "ASREngine", None)  # never reached
    assert cli.main(["--workers", "1", "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0"]) == 2
    assert one_line(capsys.readouterr().err).startswith(
        "parakeet-serve: error: worker processes need a writable temporary folder (TMPDIR or /tmp; a container")

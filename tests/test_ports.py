"""parakeet-serve's port check (parakeet_stream/server/operations/ports.py): a port it cannot listen on is one
line naming the port and its flag, exit status 2, before the model loads (so before the
configuration dump) and without a traceback.

The model named here is a folder that does not exist: the check must come first to be seen.
"""
from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from parakeet_stream.server.operations import ports
from parakeet_stream.server.operations.ports import explain, port_problem

ROOT = Path(__file__).resolve().parent.parent
NO_MODEL = "no/such/model/folder"


def serve(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "parakeet_stream.server.cli", "--model", NO_MODEL,
           "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def refused(result: subprocess.CompletedProcess) -> str:
    """The one stderr line of a refused start (nothing on stdout: no configuration dump)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "", (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def held_port():
    """A port another program listens on (as a server would: bound and listening)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("flag", ["--port", "--ws-port", "--http-port", "--grpc-port", "--agent-port"])
def test_port_in_use_is_one_line(held_port, flag):
    assert refused(serve(flag, str(held_port))) == (
        f"parakeet-serve: error: port {held_port} on 127.0.0.1 is already in use by another program: "
        f"pick another with {flag} PORT (0: any free port)")


def test_every_port_in_use_is_named_at_once():
    """Fixing the first taken port used to reveal the next, one start at a time."""
    held = [socket.socket() for _ in range(4)]
    try:
        for sock in held:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        tcp, ws, http, grpc = (sock.getsockname()[1] for sock in held)
        cmd = [sys.executable, "-m", "parakeet_stream.server.cli", "--model", NO_MODEL, "--port", str(tcp),
               "--ws-port", str(ws), "--http-port", str(http), "--grpc-port", str(grpc)]
        lines = [refused(subprocess.run([*cmd, *check], capture_output=True, text=True, timeout=120, cwd=ROOT))
                 for check in ([], ["--check"])]
    finally:
        for sock in held:
            sock.close()
    assert lines == [f"parakeet-serve: error: ports {tcp}, {ws}, {http} and {grpc} on 127.0.0.1 are already in use by "
                     "another program: pick others with --port, --ws-port, --http-port and --grpc-port "
                     "(0: any free port)"] * 2


def test_a_taken_port_and_a_privileged_one_are_named_together(held_port, monkeypatch):
    bind = ports._bind

    def refuse_80(family, kind, proto, address):  # as for a user who is not root
        if address[1] == 80:
            raise OSError(errno.EACCES, "Permission denied")
        bind(family, kind, proto, address)

    monkeypatch.setattr(ports, "_bind", refuse_80)
    assert port_problem("127.0.0.1", {"--port": held_port, "--http-port": 80}) == (
        f"port {held_port} on 127.0.0.1 is already in use by another program: pick another with --port PORT "
        "(0: any free port); port 80 needs root privileges (ports below 1024 do): pick one above 1023 with "
        "--http-port PORT")


def test_port_in_use_on_every_interface(held_port):
    line = refused(serve("--host", "0.0.0.0", "--http-port", str(held_port)))
    assert line.startswith(f"parakeet-serve: error: port {held_port} on 0.0.0.0 is already in use"), line


def test_address_not_on_this_host():
    assert refused(serve("--host", "203.0.113.1")) == (
        "parakeet-serve: error: --host 203.0.113.1 is not an address of this machine: use 127.0.0.1 "
        "(this machine only), 0.0.0.0 (every interface) or one of its own addresses")


def test_same_port_twice():
    assert refused(serve("--port", "18765", "--ws-port", "18765")) == (
        "parakeet-serve: error: --port and --ws-port both name port 18765: each needs its own")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may bind privileged ports")
def test_privileged_port_needs_root():
    assert refused(serve("--http-port", "80")) == (
        "parakeet-serve: error: port 80 needs root privileges (ports below 1024 do): pick one above 1023 "
        "with --http-port PORT")


def test_privileged_port_message():
    """The same message as above, where the tests run as root and the kernel lets the bind pass."""
    denied = OSError(errno.EACCES, "Permission denied")
    assert explain(denied, "0.0.0.0", 443, "--ws-port") == (
        "port 443 needs root privileges (ports below 1024 do): pick one above 1023 with --ws-port PORT")
    assert explain(denied, "0.0.0.0", 8080, "--ws-port") == (
        "cannot listen on 0.0.0.0 port 8080 (--ws-port): Permission denied")


def test_free_ports_and_unwanted_ones_pass(held_port):
    assert port_problem("127.0.0.1", {"--port": 0, "--ws-port": 0, "--agent-port": None}) is None
    assert port_problem("127.0.0.1", {"--agent-port": None, "--port": 0, "--http-port": held_port}) is not None


def test_port_taken_while_the_model_loads_is_one_line(held_port, tiny_model_dir, monkeypatch, capsys):
    """The check before the model loads passed (the port was free then); the listener's bind fails."""
    from parakeet_stream.server import cli

    checks = []

    def free_at_first(host, ports):
        checks.append(ports)
        return None if len(checks) == 1 else port_problem(host, ports)

    monkeypatch.setattr(cli, "port_problem", free_at_first)
    code = cli.main(["--model", str(tiny_model_dir), "--port", "0", "--ws-port", str(held_port),
                     "--http-port", "0", "--grpc-port", "0", "--log-level", "error"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"parakeet-serve: error: port {held_port} on 127.0.0.1 is already in use by another program: "
        f"pick another with --ws-port PORT (0: any free port)")

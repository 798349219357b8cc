"""The container image, built and run for real with podman and no registry.

The base is Debian's own packages: `mmdebstrap` makes a minimal bookworm tarball (cached in
results/container/, keyed by its command line), `podman import` turns it into the image the
Containerfile's BASE names. The build then needs only the package registries (apt, pip): torch's
CPU wheel is fetched on this machine (from PARAKEET_TORCH_INDEX, else PyTorch's CPU index; pip's own
configuration) and handed to the build as a folder of wheels, the build's own torch index left as
the Containerfile sets it.

The cpu image then runs with a read-only root filesystem and nothing writable (no tmpfs), configured
by a PARAKEET_ variable and a flag: it gets ready, `/health` answers 200 (and `podman healthcheck
run` passes), one stream over TCP, one over WebSocket and one Riva Recognize over gRPC give the
tokens and text of the demo model run in this process, and `podman stop` during a stream lets it
finish (final result, `closed` `server_shutdown`) before the container exits 0. Worker processes
(--workers, the default on a GPU) are refused in one line without a tmpfs on /tmp and serve with
one. The cuda target is built with the same wheel folder, so its torch is the CPU build: the
target builds and its image is configured as the cpu one plus NVIDIA's variables (its virtual
environment's steps, then the same as the cpu ones, come from podman's cache), but PyPI's CUDA wheel
(about 3 GB with its NVIDIA libraries) is fetched and installed only with PARAKEET_TEST_CUDA_WHEEL=1.
Nothing here needs a GPU.

Every container and image lives in a store of its own under a temporary folder, removed at the end;
build timings and image sizes go to results/container/timings.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest
import riva.client as riva_client
import trio
from helpers import Raw, audio_messages, http_get, pcm16_exact, result_tokens, run_stream, tokens_of, transcribe_raw

from parakeet_stream.client import encode_audio
from parakeet_stream.engine import ASREngine

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "results" / "container"
CONTAINERFILE = (ROOT / "Containerfile").read_text()
TORCH_VERSION = re.search(r"^ARG TORCH_VERSION=(\S+)", CONTAINERFILE, re.M).group(1)
SUITE, MIRROR, PYTHON = "bookworm", "http://deb.debian.org/debian", "3.11"  # bookworm's python3
# what bookworm-slim leaves out too: documentation, manuals, translations
MMDEBSTRAP = ["mmdebstrap", "--variant=minbase", "--mode=unshare",
              *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")), SUITE]
BASE = f"localhost/parakeet-base:{SUITE}"
DRAIN_TIMEOUT, STOP_TIMEOUT = 30, 45  # podman stop -t: more than the drain (as the documentation says)
# a root filesystem that is read-only, and no tmpfs on /tmp, /run, /var/tmp (podman adds them unless told not to)
RUN = ["--pull=never", "--read-only", "--read-only-tmpfs=false"]
PORTS = {"tcp": 8765, "ws": 8000, "http": 8080, "grpc": 50051}
# rlimits podman may always set (lower than any host's), a runtime that works on cgroups v1 and v2,
# and no systemd needed for events and cgroups
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
events_logger = "file"
cgroup_manager = "cgroupfs"
"""


def why_not() -> str | None:
    """Why podman images cannot be built and run here, or None."""
    for tool in ("podman", "mmdebstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True).returncode:
        return "no user namespaces (mmdebstrap --mode=unshare needs them)"
    if platform.machine() not in ("x86_64", "aarch64"):
        return f"no torch wheel for {platform.machine()}"
    return None


pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))


class Podman:
    """podman on a store of its own (`--root`/`--runroot` in `folder`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "containers.conf").write_text(CONTAINERS_CONF + ('runtime = "runc"\n' if shutil.which("runc") else ""))
        self.env = {**os.environ, "CONTAINERS_CONF": str(folder / "containers.conf")}
        self.argv = ["podman", "--root", str(folder / "storage"), "--runroot", str(folder / "run")]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        done = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and done.returncode:
            raise AssertionError(f"podman {' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-3000:]}")
        return done.stdout.strip()

    def build(self, target: str, wheels: Path | None, log: Path) -> str:
        """Build the Containerfile's `target` as localhost/parakeet-stream:TARGET; returns the tag."""
        tag = f"localhost/parakeet-stream:{target}"
        args = ["build", "--format", "docker", "--network", "host", "--pull=never", "--target", target, "-t", tag,
                "--build-arg", f"BASE={BASE}"]
        if wheels is not None:  # torch from the folder
            args += ["-v", f"{wheels}:/wheels:ro", "--build-arg", "PIP_FIND_LINKS=/wheels"]
        ca = Path("/etc/ssl/certs/ca-certificates.crt")  # this machine's CAs (a proxy's too) for pip
        if ca.is_file():
            args += ["-v", f"{ca}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
        for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
            if os.environ.get(name, "").startswith("http"):
                args += ["--build-arg", f"{name}={os.environ[name]}"]
        with open(log, "w") as out:
            done = subprocess.run([*self.argv, *args, str(ROOT)], stdout=out, stderr=subprocess.STDOUT,
                                  timeout=3600, env=self.env)
        assert done.returncode == 0, f"podman build --target {target} failed: {log.read_text()[-3000:]}"
        return tag

    def size_mb(self, image: str) -> float:
        return int(self("image", "inspect", "--format", "{{.Size}}", image)) / 1e6

    def config(self, image: str) -> dict:
        """The image's configuration, with its HEALTHCHECK (which podman keeps beside it)."""
        found = json.loads(self("image", "inspect", image))[0]
        return {**found["Config"], "Healthcheck": found.get("Healthcheck")}

    def remove_all(self) -> None:
        """Every container and image of the store, then the store itself."""
        self("rm", "--all", "--force", "--volumes", "--time", "0", check=False)
        self("rmi", "--all", "--force", check=False)
        if os.path.ismount(self.folder / "storage" / "overlay"):  # the overlay driver's own bind mount
            subprocess.run(["umount", str(self.folder / "storage" / "overlay")], check=False)
        shutil.rmtree(self.folder, ignore_errors=True)

    def torch_in(self, image: str) -> str:
        return self("run", "--rm", "--pull=never", "--entrypoint", "python3", image, "-c",
                    "import torch; print(torch.__version__)", timeout=120)


def base_tarball() -> Path:
    """The mmdebstrap tarball, made once per command line."""
    key = hashlib.sha256(" ".join([*MMDEBSTRAP, MIRROR]).encode()).hexdigest()[:12]
    tarball = CACHE / f"base-{SUITE}-{key}.tar"
    if not tarball.is_file():
        partial = tarball.with_suffix(".partial.tar")  # mmdebstrap's format follows the name
        done = subprocess.run([*MMDEBSTRAP, str(partial), MIRROR], capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"mmdebstrap failed: {done.stderr[-3000:]}"
        partial.rename(tarball)
    return tarball


def torch_wheels() -> Path:
    """A folder with torch's CPU wheel for the image's Python (torch alone)."""
    folder = CACHE / "wheels"
    if not list(folder.glob(f"torch-{TORCH_VERSION}+cpu-cp{PYTHON.replace('.', '')}-*.whl")):
        index = os.environ.get("PARAKEET_TORCH_INDEX") or "https://download.pytorch.org/whl/cpu"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", f"torch=={TORCH_VERSION}", "--no-deps", "--only-binary=:all:",
             "--python-version", PYTHON, "--platform", f"manylinux_2_28_{platform.machine()}", "--index-url", index,
             "-d", str(folder)], capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"pip download torch failed: {done.stderr[-3000:]}"
    return folder


@pytest.fixture(scope="module")
def podman():
    podman = Podman(Path(tempfile.mkdtemp(prefix="parakeet-podman-")))
    podman.timings = {}
    CACHE.mkdir(parents=True, exist_ok=True)
    try:
        started = time.monotonic()
        podman("import", str(base_tarball()), BASE)
        podman.timings["base_s"] = round(time.monotonic() - started, 1)
        podman.wheels = torch_wheels()
        yield podman
    finally:
        podman.remove_all()
        (CACHE / "timings.json").write_text(json.dumps(podman.timings, indent=1))


@pytest.fixture(scope="module")
def cpu_image(podman) -> str:
    started = time.monotonic()
    image = podman.build("cpu", podman.wheels, CACHE / "build-cpu.log")
    podman.timings["build_cpu_s"] = round(time.monotonic() - started, 1)
    podman.timings["cpu_image_mb"] = round(podman.size_mb(image))
    return image


@pytest.fixture(scope="module")
def reference(wavs):
    """The sentence as the demo model transcribes it in this process (float32, the container's too)."""
    sentence = pcm16_exact(wavs["sentence"])
    with ASREngine("demo") as engine:
        results = run_stream(engine, sentence)
    return sentence, tokens_of(results), "".join(r.text for r in results)  # the native protocol's text is the whole


class Server:
    """A container of `image` (read-only root; a tmpfs on /tmp if asked), its ports on free ones of 127.0.0.1,
    ready; float32 (the in-process reference's precision) and the drain timeout set by PARAKEET_ variables."""

    def __init__(self, podman: Podman, image: str, name: str, *flags: str, tmpfs: bool = False) -> None:
        self.podman, self.name = podman, name
        publish = [arg for port in PORTS.values() for arg in ("-p", f"127.0.0.1::{port}")]
        podman("run", "-d", "--name", name, *RUN, *(["--tmpfs", "/tmp"] if tmpfs else []), *publish,
               "-e", "PARAKEET_DTYPE=float32", "-e", f"PARAKEET_DRAIN_TIMEOUT={DRAIN_TIMEOUT}", image, *flags)
        self.ports = {kind: int(podman("port", self.name, f"{port}/tcp").rsplit(":", 1)[1])
                      for kind, port in PORTS.items()}
        deadline = time.monotonic() + 120
        while "parakeet-serve ready:" not in (log := self.log()):
            assert self.state()["Running"] and time.monotonic() < deadline, f"not ready: {log[-3000:]}"
            time.sleep(0.2)
        self.ready_line = next(line for line in log.splitlines() if line.startswith("parakeet-serve ready:"))

    def log(self) -> str:
        """stdout (configuration, ready line) and stderr (the log), one after the other."""
        done = subprocess.run([*self.podman.argv, "logs", self.name], capture_output=True, text=True, env=self.podman.env)
        return done.stdout + done.stderr

    def state(self) -> dict:
        return json.loads(self.podman("inspect", "--format", "{{json .State}}", self.name))

    def url(self, kind: str) -> str:
        return f"tcp://127.0.0.1:{self.ports['tcp']}" if kind == "tcp" else f"ws://127.0.0.1:{self.ports['ws']}/"


@pytest.fixture(scope="module")
def server(podman, cpu_image):
    server = Server(podman, cpu_image, "parakeet-test", "--max-num-streams", "4")
    yield server
    (CACHE / "server.log").write_text(server.log())


def riva_text(port: int, samples) -> str:
    """NVIDIA Riva's Recognize through the gRPC port, as riva.client's users call it."""
    service = riva_client.ASRService(riva_client.Auth(uri=f"127.0.0.1:{port}", use_ssl=False))
    config = riva_client.RecognitionConfig(encoding=riva_client.AudioEncoding.LINEAR_PCM, sample_rate_hertz=16000,
                                           language_code="en-US")
    response = service.offline_recognize(encode_audio(samples, "pcm16"), config)
    return "".join(result.alternatives[0].transcript for result in response.results).strip()


def test_cpu_image_is_small_non_root_and_documented(podman, cpu_image):
    config = podman.config(cpu_image)
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["parakeet-serve"]
    assert set(config["ExposedPorts"]) == {f"{port}/tcp" for port in PORTS.values()}
    assert config["StopSignal"] == "SIGTERM"
    assert "/health" in " ".join(config["Healthcheck"]["Test"])
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PARAKEET_HOST"] == "0.0.0.0" and env["HF_HOME"] in config["Volumes"]
    assert podman.torch_in(cpu_image) == f"{TORCH_VERSION}+cpu"
    assert podman.size_mb(cpu_image) < 1500


async def test_ready_health_and_a_stream_over_tcp_and_websocket(server, reference):
    sentence, tokens, text = reference
    assert server.ready_line.startswith("parakeet-serve ready: tcp://0.0.0.0:8765 ws://0.0.0.0:8000")
    status, body = await http_get(server.ports["http"], "/health")
    health = orjson.loads(body)
    assert status == 200 and health["status"] == "ok" and health["demo_model"], health
    assert health["precision"]["dtype"] == "float32" and health["max_num_streams"] == 4  # environment and flag
    assert (await http_get(server.ports["http"], "/ready"))[0] == 200
    server.podman("healthcheck", "run", server.name)  # the image's HEALTHCHECK: exit status 0
    for kind in ("tcp", "ws"):
        results = await transcribe_raw(server.url(kind), sentence)
        assert result_tokens(results) == tokens and results[-1]["text"] == text, kind
    assert await trio.to_thread.run_sync(riva_text, server.ports["grpc"], sentence) == " ".join(text.split())
    with pytest.raises(AssertionError, match="Read-only file system"):
        server.podman("exec", server.name, "touch", "/app/written")


async def test_podman_stop_lets_the_active_stream_finish_and_exits_0(server, reference):
    sentence, tokens, text = reference
    stopped = {}

    async def stop() -> None:
        started = time.monotonic()
        await trio.to_thread.run_sync(lambda: server.podman("stop", "-t", str(STOP_TIMEOUT), server.name, timeout=60))
        stopped["seconds"] = server.podman.timings["stop_s"] = round(time.monotonic() - started, 1)

    async with Raw.open(server.url("tcp")) as conn, trio.open_nursery() as nursery:
        assert (await conn.recv())["type"] == "hello"
        for i, message in enumerate(audio_messages(sentence)):  # paced: 3.5 s of audio in 3.5 s
            await conn.send(message)
            if i == 5:  # the stream is active: the server has answered some of it
                nursery.start_soon(stop)
            await trio.sleep(0.1)
        seen = await conn.rest()
    results = [m for m in seen if m["type"] == "result"]
    assert [m["is_final"] for m in results].count(True) == 1 and results[-1]["is_final"]
    assert result_tokens(results) == tokens and results[-1]["text"] == text
    assert seen[-1] == {"type": "closed", "reason": "server_shutdown"}
    state = server.state()
    assert state["ExitCode"] == 0 and stopped["seconds"] < STOP_TIMEOUT, (state, stopped)
    log = server.log()
    assert "SIGTERM: draining" in log and "parakeet-serve stopped (drained)" in log, log[-2000:]


def test_worker_processes_need_a_tmpfs_on_tmp(podman, cpu_image, reference):
    """On a GPU the server runs its protocol work in worker processes (--workers), which meet the engine
    through a socket in a temporary folder: refused in one line on a read-only root, served with a tmpfs."""
    refused = subprocess.run([*podman.argv, "run", "--rm", *RUN, cpu_image, "--workers", "1"],
                             capture_output=True, text=True, timeout=120, env=podman.env)
    assert refused.returncode == 2 and "worker processes need a writable temporary folder" in refused.stderr, refused
    sentence, tokens, _ = reference
    server = Server(podman, cpu_image, "parakeet-workers", "--workers", "1", tmpfs=True)
    try:
        assert result_tokens(trio.run(transcribe_raw, server.url("tcp"), sentence)) == tokens
        podman("stop", "-t", str(STOP_TIMEOUT), server.name, timeout=60)
        assert server.state()["ExitCode"] == 0
    finally:
        podman("rm", "--force", "--volumes", server.name, check=False)


def test_cuda_target_builds(podman, cpu_image):
    """Every instruction of the cuda target; with PARAKEET_TEST_CUDA_WHEEL=1 with PyPI's CUDA torch too."""
    cuda_wheel = os.environ.get("PARAKEET_TEST_CUDA_WHEEL") == "1"
    started = time.monotonic()
    image = podman.build("cuda", None if cuda_wheel else podman.wheels, CACHE / "build-cuda.log")
    podman.timings["build_cuda_s" if cuda_wheel else "build_cuda_with_cpu_torch_s"] = round(time.monotonic() - started, 1)
    podman.timings["cuda_image_mb" if cuda_wheel else "cuda_image_with_cpu_torch_mb"] = round(podman.size_mb(image))
    config = podman.config(image)
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    cpu_config = podman.config(cpu_image)
    assert {k: config[k] for k in ("User", "Entrypoint", "ExposedPorts", "Healthcheck", "StopSignal", "Volumes")} == \
        {k: cpu_config[k] for k in ("User", "Entrypoint", "ExposedPorts", "Healthcheck", "StopSignal", "Volumes")}
    torch_version = podman.torch_in(image)
    assert torch_version.startswith(TORCH_VERSION) and torch_version.endswith("+cpu") != cuda_wheel, torch_version

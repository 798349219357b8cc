"""Models by Hugging Face name (parakeet_stream/hub.py) against a loopback fake hub (fakehub.py).

The CLIs run as subprocesses with HF_ENDPOINT pointing at the fake hub and HF_HOME in tmp_path,
so huggingface_hub sees a fresh environment each time and nothing leaves this machine. The fake
hub serves tiny .nemo checkpoints repacked from tests/fixtures/nemo/eou_tiny.nemo with
model_config.yaml stored after the weights, so reading the config first needs range requests
that hop over them.
"""
from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from fakehub import FakeHub, Repo
from safetensors.torch import load_file

from parakeet_stream.model import hub as hubmod
from parakeet_stream.model.errors import ModelNotFound
from parakeet_stream.model.loading import resolve_model_dir

ROOT = Path(__file__).resolve().parent.parent
NEMO = ROOT / "tests" / "fixtures" / "nemo" / "eou_tiny.nemo"
SENTENCE = ROOT / "tests" / "fixtures" / "audio" / "sentence.wav"
TINY, NOT_STREAMING, SMALL = "testorg/tiny-eou", "testorg/not-streaming", "nvidia/parakeet_realtime_eou_120m-v1"
TIMEOUT = 300


def repacked_nemo(edit_config=None) -> bytes:
    """eou_tiny.nemo with model_config.yaml moved behind the weights (optionally edited)."""
    with tarfile.open(NEMO) as src:
        members = {m.name.removeprefix("./"): src.extractfile(m).read() for m in src.getmembers() if m.isfile()}
    config = yaml.safe_load(members.pop("model_config.yaml"))
    if edit_config:
        edit_config(config)
    members["model_config.yaml"] = yaml.safe_dump(config).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members.items():  # weights before the config (dicts keep insertion order)
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def not_streaming(config: dict) -> None:
    config["encoder"]["att_context_style"] = "regular"


TINY_NEMO = repacked_nemo()
NOT_STREAMING_NEMO = repacked_nemo(not_streaming)


@pytest.fixture
def hub():
    fake = FakeHub({
        TINY: Repo({"README.md": b"# tiny\n", "eou_tiny.nemo": TINY_NEMO}),
        NOT_STREAMING: Repo({"model.nemo": NOT_STREAMING_NEMO}),
        SMALL: Repo({"parakeet_realtime_eou_120m-v1.nemo": TINY_NEMO}),
    })
    yield fake
    fake.stop()


def hub_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "XDG_CACHE"))}
    return env | {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
                  "PYTHONUNBUFFERED": "1"} | extra


def run(module: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT, cwd=ROOT)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a failing CLI ends with (progress bars and hub warnings may come before it)."""
    assert "Traceback" not in result.stderr, result.stderr
    return re.split(r"[\r\n]+", result.stderr.strip())[-1]


def cache_dir(tmp_path: Path, repo: str) -> Path:
    return tmp_path / "hf" / "parakeet-stream" / ("models--" + repo.replace("/", "--"))


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def local_tokens(tiny_model_dir) -> list[int]:
    """What parakeet-transcribe gives for the sentence with the locally converted eou_tiny.nemo."""
    result = run("parakeet_stream.tools.transcribe", str(SENTENCE), "--model", str(tiny_model_dir), "--json",
                 env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    tokens = json.loads(result.stdout.splitlines()[-1])["token_ids"]
    assert tokens
    return tokens


def transcribe_tokens(model: str, env: dict) -> tuple[list[int], str]:
    result = run("parakeet_stream.tools.transcribe", str(SENTENCE), "--model", model, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])["token_ids"], result.stderr


def test_first_load_converts_once_then_works_without_the_hub(hub, tmp_path, tiny_model_dir, local_tokens):
    env = hub_env(tmp_path, hub.url)
    tokens, stderr = transcribe_tokens(TINY, env)
    assert tokens == local_tokens
    assert "downloading testorg/tiny-eou" in stderr and "converting" in stderr
    commit = hub.repos[TINY].commit
    folder = cache_dir(tmp_path, TINY) / commit
    assert (cache_dir(tmp_path, TINY) / "refs" / "main").read_text() == commit
    assert (folder / "config.json").read_text() == (tiny_model_dir / "config.json").read_text()
    ours, local = load_file(str(folder / "model.safetensors")), load_file(str(tiny_model_dir / "model.safetensors"))
    assert ours.keys() == local.keys() and all(ours[k].equal(local[k]) for k in ours)
    # the config was read first (small range requests), then the checkpoint was downloaded once
    assert len(TINY_NEMO) <= hub.file_bytes_sent(TINY_NEMO) < len(TINY_NEMO) + 16 * 1024
    assert not list(folder.parent.glob(".*")), "temporary folders left in the cache"

    hub.stop()  # later starts need no network at all
    tokens, stderr = transcribe_tokens(TINY, env)
    assert tokens == local_tokens and "downloading" not in stderr and "converting" not in stderr
    tokens, _ = transcribe_tokens(TINY, env | {"HF_HUB_OFFLINE": "1"})
    assert tokens == local_tokens
    tokens, _ = transcribe_tokens(f"{TINY}@{commit}", env)
    assert tokens == local_tokens


def test_multilingual_alias_downloads_and_converts_the_language_prompt_family(tmp_path):
    """`multilingual` names NVIDIA's nemotron-3.5-asr (here its tiny stand-in): downloaded, its config
    read before the weights, converted (prompt kernel and languages) like the others."""
    repo = "nvidia/nemotron-3.5-asr-streaming-0.6b"
    checkpoint = (NEMO.parent / "prompt_tiny.nemo").read_bytes()
    fake = FakeHub({repo: Repo({"nemotron-3.5-asr-streaming-0.6b.nemo": checkpoint})})
    try:
        result = run("parakeet_stream.tools.convert", "multilingual", str(tmp_path / "out"),
                     env=hub_env(tmp_path, fake.url))
    finally:
        fake.stop()
    assert result.returncode == 0, result.stderr
    assert "downloading nvidia/nemotron-3.5-asr-streaming-0.6b" in result.stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["prompt"]["languages"] == {"en-US": 0, "es-ES": 1, "de-DE": 2, "auto": 7}
    assert {k.split(".")[0] for k in load_file(str(tmp_path / "out" / "model.safetensors"))} >= {"prompt"}


def test_offline_with_empty_cache_fails_in_one_line(hub, tmp_path):
    result = run("parakeet_stream.tools.transcribe", str(SENTENCE), "--model", TINY,
                 env=hub_env(tmp_path, hub.url, HF_HUB_OFFLINE="1"))
    assert result.returncode == 2
    assert error_line(result).startswith("parakeet-transcribe: error: testorg/tiny-eou is not in the model cache")
    assert "HF_HUB_OFFLINE" in error_line(result) and not hub.requests
    assert not cache_dir(tmp_path, TINY).exists()


def test_missing_repo_and_revision_fail_in_one_line(hub, tmp_path):
    env = hub_env(tmp_path, hub.url)
    result = run("parakeet_stream.tools.convert", "testorg/no-such-model", env=env)
    assert result.returncode == 1
    assert error_line(result) == (f"parakeet-convert: error: testorg/no-such-model: no such model on {hub.url} "
                                  "(a private one needs HF_TOKEN)")
    result = run("parakeet_stream.tools.convert", f"{TINY}@v9", env=env)
    assert result.returncode == 1 and error_line(result).endswith("testorg/tiny-eou: no revision 'v9'")
    assert not (tmp_path / "hf" / "parakeet-stream").exists() or not any((tmp_path / "hf" / "parakeet-stream").iterdir())


def test_unreachable_hub_fails_in_one_line(tmp_path):
    result = run("parakeet_stream.server.cli", "--model", TINY, "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0",
                 env=hub_env(tmp_path, closed_port_url()))
    assert result.returncode == 2
    assert re.fullmatch(r"parakeet-serve: error: cannot reach http://127\.0\.0\.1:\d+ to download testorg/tiny-eou "
                        r"\(.*\)", error_line(result)), error_line(result)


def test_interrupted_download_leaves_no_entry_and_the_next_attempt_succeeds(hub, tmp_path, local_tokens):
    env = hub_env(tmp_path, hub.url)
    hub.cut(after=len(TINY_NEMO) // 3)
    result = run("parakeet_stream.tools.convert", TINY, env=env)
    assert result.returncode == 1
    assert re.fullmatch(r"parakeet-convert: error: the download of testorg/tiny-eou was interrupted \(.*\); "
                        r"run the command again", error_line(result)), error_line(result)
    repo_dir = cache_dir(tmp_path, TINY)
    assert not repo_dir.exists() or not any(repo_dir.iterdir()), list(repo_dir.rglob("*"))

    assert not list((tmp_path / "hf").rglob("*.nemo")) and not list((tmp_path / "hf").rglob("*.incomplete"))

    hub.cut(None)
    result = run("parakeet_stream.tools.convert", TINY, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {repo_dir / hub.repos[TINY].commit}:")
    tokens, _ = transcribe_tokens(TINY, env | {"HF_HUB_OFFLINE": "1"})
    assert tokens == local_tokens


def test_unsupported_model_refused_before_its_weights(hub, tmp_path):
    result = run("parakeet_stream.tools.convert", NOT_STREAMING, env=hub_env(tmp_path, hub.url))
    assert result.returncode == 1
    assert error_line(result) == ("parakeet-convert: error: testorg/not-streaming: unsupported model: encoder is "
                                  "not cache-aware streaming (att_context_style is not chunked_limited)")
    assert hub.file_bytes_sent(NOT_STREAMING_NEMO) < 16 * 1024  # headers and the config, not the weights
    assert not cache_dir(tmp_path, NOT_STREAMING).exists()
    assert not list((tmp_path / "hf").rglob("*.nemo"))


def test_names_and_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert hubmod.parse("small") == (SMALL, "main")
    assert hubmod.parse("large") == ("nvidia/nemotron-speech-streaming-en-0.6b", "main")
    assert hubmod.parse("multilingual") == ("nvidia/nemotron-3.5-asr-streaming-0.6b", "main")
    assert hubmod.parse("org/name@v1.0") == ("org/name", "v1.0")
    assert hubmod.parse("org/name@refs/pr/3") == ("org/name", "refs/pr/3")
    for bad in ("demo", "org", "org/name/extra", "org/name@../x", "/abs/path", "org/name@"):
        assert not hubmod.is_hub_name(bad), bad
    (tmp_path / "empty").mkdir()
    (tmp_path / "model.nemo").write_bytes(b"")
    with pytest.raises(ModelNotFound, match="not a model folder"):
        resolve_model_dir(tmp_path / "empty")
    with pytest.raises(ModelNotFound, match="convert it first"):
        resolve_model_dir(tmp_path / "model.nemo")
    with pytest.raises(ModelNotFound, match="no model 'nonsense'"):
        resolve_model_dir("nonsense")
    with pytest.raises(ModelNotFound, match="no model 'tests/no-such-folder'"):
        resolve_model_dir("tests/no-such-folder")  # ORG is a local folder: a path, no hub look-up
    assert not hubmod.is_hub_name("weights/model.nemo")


# ---------------------------------------------------------------- scripts/serve.sh


class ServeSh:
    """`bash scripts/serve.sh` with free ports; the ready line read from its stdout."""

    def __init__(self, env: dict, *args: str) -> None:
        cmd = ["bash", str(ROOT / "scripts" / "serve.sh"), "--port", "0", "--ws-port", "0", "--http-port", "0",
               "--grpc-port", "0", "--log-level", "warning", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.stdout = []
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))
            if line.startswith("parakeet-serve ready:"):
                break
        else:
            raise AssertionError(f"serve.sh did not start: {self.proc.stderr.read()[-3000:]}")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)  # serve.sh execs parakeet-serve: this is the server
        _, stderr = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, stderr
        return stderr


@pytest.fixture
def serve_sh():
    started = []
    yield lambda env, *args: started.append(ServeSh(env, *args)) or started[-1]
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate()


def needs_installed_venv():
    if not (ROOT / ".venv" / "bin" / "parakeet-serve").exists():
        pytest.skip("scripts/serve.sh uses .venv (bash scripts/test.sh installs it)")


def test_serve_sh_without_network_serves_the_demo_model(serve_sh, tmp_path):
    needs_installed_venv()
    server = serve_sh(hub_env(tmp_path, closed_port_url()))
    assert "  model = demo" in server.stdout
    stderr = server.stop()
    notes = [line for line in stderr.splitlines() if "no network" in line]
    assert len(notes) == 1 and notes[0].startswith("no network: cannot reach http://127.0.0.1:")
    assert notes[0].endswith("; serving the demo model instead"), notes
    assert "Traceback" not in stderr


def test_serve_sh_downloads_small_and_serves_it(serve_sh, hub, tmp_path):
    needs_installed_venv()
    env = hub_env(tmp_path, hub.url)
    server = serve_sh(env)
    assert "  model = small" in server.stdout
    stderr = server.stop()
    assert "downloading nvidia/parakeet_realtime_eou_120m-v1" in stderr and "no network" not in stderr
    assert (cache_dir(tmp_path, SMALL) / hub.repos[SMALL].commit / "model.safetensors").is_file()
    # `--model demo` asks for the demo model directly: no hub, no message
    hub.requests.clear()
    server = serve_sh(env, "--model", "demo")
    assert "  model = demo" in server.stdout
    assert "no network" not in server.stop() and not hub.requests


def test_serve_sh_checks_the_ports_before_any_download(hub, tmp_path):
    needs_installed_venv()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(["bash", str(ROOT / "scripts" / "serve.sh"), "--port", str(port), "--ws-port", "0",
                               "--http-port", "0", "--grpc-port", "0"],
                              env=hub_env(tmp_path, hub.url), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"parakeet-serve: error: port {port} on 127.0.0.1 is already in use by another "
                                   "program: pick another with --port PORT (0: any free port)")
    assert not hub.requests


@pytest.mark.parametrize("index", ["", "https://download.pytorch.org/whl/cpu"])
def test_serve_sh_installs_torch_from_the_index_it_is_given(tmp_path, index):
    """serve.sh in a copy of the tree whose .venv holds stand-ins that record their arguments
    (this machine reaches no index but its own mirror): PARAKEET_TORCH_INDEX becomes pip's
    --index-url for torch alone, without its dependencies (tests/test_install_torch.py installs for real)."""
    (tmp_path / "scripts").mkdir()
    for script in ("serve.sh", "install_torch.sh"):
        (tmp_path / "scripts" / script).write_text((ROOT / "scripts" / script).read_text())
    bin_ = tmp_path / ".venv" / "bin"
    bin_.mkdir(parents=True)
    for tool in ("python", "pip", "parakeet-serve"):
        (bin_ / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/calls"\n')
        (bin_ / tool).chmod(0o755)
    (tmp_path / "pyproject.toml").write_text("")  # newer than parakeet-serve: serve.sh installs
    os.utime(bin_ / "parakeet-serve", (0, 0))
    env = {**os.environ, "PARAKEET_TORCH_INDEX": index}
    subprocess.run(["bash", str(tmp_path / "scripts" / "serve.sh"), "--model", "demo"], env=env, check=True,
                   timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    torch_lines = [f"pip install -q --no-deps --retries 0 --timeout 15 torch==2.13.0 --index-url {index}"] if index else []
    assert calls == [*torch_lines, "pip install -q torch==2.13.0", "pip install -q -e .", "parakeet-serve --model demo"]


DIARIZER = "testorg/tiny-sortformer"
SORTFORMER_NEMO = (ROOT / "tests" / "fixtures" / "nemo" / "sortformer_tiny.nemo").read_bytes()
LOAD_DIARIZER = ("from parakeet_stream.engine.diarizer_model import load_diarizer\n"
                 "import sys; print(load_diarizer(sys.argv[1]).cfg.n_spk)")


def load_diarizer(name: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD_DIARIZER, name], capture_output=True, text=True, env=env,
                          timeout=TIMEOUT, cwd=ROOT)


def test_a_diarizer_by_hub_name_downloads_once_then_loads_without_the_hub(tmp_path):
    fake = FakeHub({DIARIZER: Repo({"diar.nemo": SORTFORMER_NEMO}), TINY: Repo({"eou_tiny.nemo": TINY_NEMO})})
    env = hub_env(tmp_path, fake.url)
    try:
        first = load_diarizer(DIARIZER, env)
        assert first.returncode == 0 and first.stdout.split() == ["4"], first.stderr
        assert f"downloading {DIARIZER}" in first.stderr
        refused = load_diarizer(TINY, env)  # a recogniser is no diarizer: refused before its weights
        assert refused.returncode == 1 and f"{TINY} is not a Streaming Sortformer" in refused.stderr
        assert fake.file_bytes_sent(TINY_NEMO) < 16 * 1024
    finally:
        fake.stop()
    again = load_diarizer(DIARIZER, env | {"HF_HUB_OFFLINE": "1"})  # no hub at all now
    assert again.returncode == 0 and again.stdout.split() == ["4"] and "downloading" not in again.stderr

"""The README and docs/ as a newcomer follows them: their commands do what they say, the
examples' extra installs what the examples import, /health's fields are all documented, and the
docs speak to users (no paths or words of how the project is built).

examples/journey.wav is espeak-ng speech (`espeak-ng -v en-us -s 160`, 16 kHz PCM16, 0.3 s of
silence before, 0.5 s after) of a sentence whose words the demo model's training text holds; the
model was not trained or tuned on the file.
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DEMO = ROOT / "weights" / "demo"
HARNESS = ROOT / "benchmarks" / "vs_parakeet_streaming"
# words and paths of how the project is built, which mean nothing to a user
INTERNAL = re.compile(r"\.\./shared|/tmp/|seeds/|\bPS\b|seed system|was lent|\b[Ii]ssue \d+|\bsessions? (with|that) a GPU")


def code_block_after(heading: str) -> list[str]:
    """The command lines of the first ```bash block after `heading` (comments stripped)."""
    block = re.search(rf"^## {re.escape(heading)}\n.*?```bash\n(.*?)```", README, re.S | re.M).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, **kwargs)


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in
                                                      (ROOT / "docs").glob("*.md")),
                                 "benchmarks/vs_parakeet_streaming/README.md"])
def test_docs_speak_to_users(doc):
    found = [line for line in (ROOT / doc).read_text().splitlines() if INTERNAL.search(line)]
    assert not found, found


@pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="weights/demo is not trained/exported yet")
def test_readme_transcription_example_prints_what_it_says():
    command = code_block_after("Transcribing files")[0]
    assert command == ".venv/bin/parakeet-transcribe examples/journey.wav"
    printed = re.search(r"The first prints `([^`]+)`", README).group(1)
    wav = ROOT / shlex.split(command)[1]
    assert wav.stat().st_size < 200_000
    result = run([sys.executable, "-m", "parakeet_stream.tools.transcribe", *shlex.split(command)[1:]])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == printed


def git_status(*paths: str) -> str:
    return run(["git", "status", "--porcelain", "--untracked-files=all", "--", *paths]).stdout


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_readme_benchmarks_run_from_the_root_and_leave_the_tree_clean(tiny_model_dir):
    commands = code_block_after("Benchmarks")
    assert not [c for c in commands if c.startswith("cd ")], commands
    for command in commands:
        argv = shlex.split(command)
        if argv[0] == ".venv/bin/python":
            assert argv[1] == "-m" and (ROOT / (argv[2].replace(".", "/") + ".py")).is_file(), command
    # a benchmark that imports its neighbour (benchmarks.model -> benchmarks.common) works when run from the root
    assert run([sys.executable, "-m", "benchmarks.model", "--help"]).returncode == 0

    bench = shlex.split(next(c for c in commands if c.startswith(".venv/bin/parakeet-bench")))
    assert "--out" not in bench  # the README relies on the default
    outputs = [ROOT / "results" / name for name in ("bench.json", "bench.png")]
    kept = {path: path.read_bytes() for path in outputs if path.is_file()}  # a user's own results
    before = git_status("results", "scripts", "benchmarks")
    server = ServerProcess(tiny_model_dir)
    try:
        argv = [sys.executable, "-m", "parakeet_stream.tools.bench", *bench[1:], "--clients", "1", "--seconds", "2"]
        argv[argv.index("--url") + 1] = server.url("tcp")
        result = run(argv)
    finally:
        server.close()
    try:
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["json"] == "results/bench.json"
        assert json.loads(outputs[0].read_text())["levels"][0]["clients"] == 1
        assert git_status("results", "scripts", "benchmarks") == before  # nothing new outside what git ignores
        assert run(["git", "check-ignore", "-q", "results/bench.json"]).returncode == 0
    finally:
        for path in outputs:
            path.unlink(missing_ok=True)
        for path, data in kept.items():
            path.write_bytes(data)


def requirements(names: list[str]) -> dict[str, str]:
    """{"deepgram-sdk": ">=7,<8", ...} from requirement strings (extras dropped)."""
    out = {}
    for spec in names:
        name, rest = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?(.*)", spec).groups()
        out[name.lower().replace("_", "-")] = rest.strip()
    return out


# import name -> distribution, where they differ
DISTRIBUTIONS = {"deepgram": "deepgram-sdk", "riva": "nvidia-riva-client"}


def test_examples_extra_covers_every_example_import():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    examples, test = requirements(extras["examples"]), requirements(extras["test"])
    installed = requirements(project["dependencies"]) | examples
    for script in sorted((ROOT / "examples").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            for module in (m.split(".")[0] for m in modules):
                if module in sys.stdlib_module_names or module == "parakeet_stream":
                    continue
                assert DISTRIBUTIONS.get(module, module) in installed, f"{script.name} imports {module}"
    for name in examples.keys() & test.keys():  # pinned alike wherever both name a package
        assert examples[name] == test[name], name
    assert "[examples]" in README


def test_health_fields_are_documented(tiny_model_dir):
    server = ServerProcess(tiny_model_dir)
    try:
        from test_web_page import http_request

        status, _, body = http_request(server.ports["http"], "/health")
    finally:
        server.close()
    assert status == 200
    health = json.loads(body)
    assert health["demo_model"] is False and health["max_queue"] == 256
    row = next(line for line in (ROOT / "docs" / "protocol.md").read_text().splitlines()
               if line.startswith("| `/health` |"))
    assert not [key for key in health if f'"{key}"' not in row], row


def test_benchmark_harness_parses():
    for script in sorted(HARNESS.glob("*.py")):
        compile(script.read_text(), str(script), "exec")
        assert "/tmp" not in script.read_text(), script.name
    assert run(["bash", "-n", str(HARNESS / "setup.sh")]).returncode == 0
    assert "github.com/odunola499/parakeet-streaming" in (HARNESS / "README.md").read_text()
    assert "benchmarks/vs_parakeet_streaming" in (ROOT / "docs" / "performance.md").read_text()

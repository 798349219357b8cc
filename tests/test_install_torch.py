"""scripts/install_torch.sh with the real pip of a fresh virtual environment and two package indexes
made here (folders of stand-in wheels, no network): PARAKEET_TORCH_INDEX serves torch alone, pip's
usual index its dependencies; an index that cannot be reached costs one line, not pages of retries."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNREACHABLE = "http://127.0.0.1:9/simple"  # a closed port


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure-Python stand-in for `name`, its version in name.VERSION."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                     *(f"Requires-Dist: {r}\n" for r in requires)]),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    project = folder / name
    project.mkdir(parents=True, exist_ok=True)
    filename = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(project / filename, "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)
    links = "".join(f'<a href="{p.name.replace("+", "%2B")}">{p.name}</a>\n' for p in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


@pytest.fixture
def indexes(tmp_path) -> tuple[str, str]:
    """(torch's index: a CPU torch that needs filelock, which it does not have; the usual index:
    filelock, and a torch of the same version that is not the CPU build)."""
    torch_index, usual = tmp_path / "torch-index", tmp_path / "usual-index"
    wheel(torch_index, "torch", "2.13.0+cpu", ("filelock",))
    wheel(usual, "torch", "2.13.0", ("filelock",))
    wheel(usual, "filelock", "3.0")
    return torch_index.as_uri(), usual.as_uri()


def install(tmp_path: Path, usual: str, torch_index: str) -> tuple[subprocess.CompletedProcess, float]:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # pip sees the two indexes and nothing of this machine's configuration
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": usual, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1", "PARAKEET_TORCH_INDEX": torch_index}
    started = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install_torch.sh"), str(venv / "bin" / "pip")], env=env,
                          capture_output=True, text=True, timeout=300)
    return done, time.monotonic() - started


def installed(tmp_path: Path) -> list[str]:
    python = tmp_path / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-c", "import filelock, torch; print(torch.VERSION, filelock.VERSION)"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.split()


def test_the_torch_index_serves_torch_alone_and_the_usual_index_its_dependencies(tmp_path, indexes):
    """Before, torch's dependencies were asked of torch's index too: No matching distribution found for filelock."""
    torch_index, usual = indexes
    done, _ = install(tmp_path, usual, torch_index)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert installed(tmp_path) == ["2.13.0+cpu", "3.0"]


def test_an_unreachable_torch_index_is_one_line_then_the_usual_index(tmp_path, indexes):
    """Before, pip retried the closed port five times a page (a flood of Retrying warnings), then failed."""
    _, usual = indexes
    done, seconds = install(tmp_path, usual, UNREACHABLE)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"install_torch.sh: no torch 2.13.0 from {UNREACHABLE} (unreachable, or no "
                                        "such wheel there): installing it from the usual index"]
    assert installed(tmp_path) == ["2.13.0", "3.0"] and seconds < 60

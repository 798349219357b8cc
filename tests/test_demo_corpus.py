"""The demo corpus's text stage (demo_model/data.py) and the trainer's guards (demo_model/train.py:
--init with another tokenizer, --freq-warp out of range, a cooldown outside the budget)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORTUNES = Path("/usr/share/games/fortunes")


def text_stage(out: Path, *extra: str) -> Path:
    subprocess.run([sys.executable, "-m", "demo_model.data", "--out", str(out), "--text-only",
                    "--train-sentences", "2000", "--n-test", "40", *extra], check=True, capture_output=True, cwd=ROOT)
    return out / "text"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.mark.skipif(not FORTUNES.is_dir(), reason="fortunes is not installed (scripts/test.sh installs it)")
def test_test_text_reuses_an_earlier_corpus_test_sentences_and_keeps_them_out_of_train(tmp_path):
    first = text_stage(tmp_path / "a")
    wider = text_stage(tmp_path / "b", "--vocab-size", "6000", "--test-text", str(first))
    for name in ("test_sentences", "test_voices"):
        assert lines(wider / f"{name}.txt") == lines(first / f"{name}.txt")
    held = set(lines(first / "test_sentences.txt")) | set(lines(first / "test_voices.txt"))
    assert len(held) == 80
    assert not held & set(lines(wider / "train.txt"))
    # a wider vocabulary is what the option is for
    assert set(lines(wider / "vocab.txt")) > set(lines(first / "vocab.txt"))
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert set(config["test_text"]) == {"test_sentences", "test_voices"}
    # without the option the wider corpus would draw other test sentences
    own = text_stage(tmp_path / "c", "--vocab-size", "6000")
    assert lines(own / "test_sentences.txt") != lines(first / "test_sentences.txt")


def train_demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "demo_model.train", *args, "--nice", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def refused_in_one_line(run: subprocess.CompletedProcess) -> str:
    assert run.returncode != 0
    [line] = run.stderr.strip().splitlines()
    return line


def test_init_refuses_a_data_folder_with_another_tokenizer(tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(b"not the demo model's tokenizer")
    run = train_demo("--data", str(tmp_path), "--init", str(ROOT / "weights" / "demo"))
    assert run.returncode != 0
    assert "another tokenizer than the model's" in run.stderr
    assert (tmp_path / "tokenizer.model").read_bytes() == b"not the demo model's tokenizer"


def test_test_text_without_test_splits_is_refused_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "demo_model.data", "--out", str(tmp_path / "c"),
                          "--text-only", "--test-text", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [
        f"--test-text {tmp_path}: no test_sentences.txt or test_voices.txt there "
        "(expected an earlier corpus's text/ folder)"]
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("warp", ["0.5", "-0.1"])
def test_an_impossible_frequency_warp_is_refused_in_one_line(tmp_path, warp):
    run = train_demo("--data", str(tmp_path / "d"), "--freq-warp", warp)
    assert refused_in_one_line(run) == f"--freq-warp {float(warp)}: must be at least 0 (off) and below 0.5"
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("cooldown, minutes", [("30", "20"), ("5", None), ("-1", "20")])
def test_a_cooldown_outside_the_budget_is_refused_in_one_line(tmp_path, cooldown, minutes):
    budget = ["--minutes", minutes] if minutes else []
    run = train_demo("--data", str(tmp_path / "d"), "--cooldown-minutes", cooldown, *budget)
    assert refused_in_one_line(run) == (f"--cooldown-minutes {cooldown}: must be above 0 and within the --minutes "
                                        f"budget ({minutes or 0}; 0 means no budget)")
    assert not (tmp_path / "d").exists()

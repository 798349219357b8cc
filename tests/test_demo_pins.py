"""tests/fixtures/demo_pins.json: what the tests pin of the bundled demo model is the model's own,
measured by tests/fixtures/make_demo_pins.py (to run again whenever weights/demo changes)."""
from __future__ import annotations

import copy
import hashlib
import importlib.util
from pathlib import Path

import pytest
from helpers import demo_pins

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "weights" / "demo" / "model.safetensors"


def make_pins():
    spec = importlib.util.spec_from_file_location("make_demo_pins", ROOT / "tests" / "fixtures" / "make_demo_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not MODEL.is_file(), reason="weights/demo is absent")
def test_the_pins_are_the_bundled_models():
    digest = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    assert demo_pins()["model_sha256"] == digest, (
        "weights/demo changed: run `.venv/bin/python tests/fixtures/make_demo_pins.py` to measure the new model's pins")


@pytest.mark.parametrize("where, value, said", [
    (("eou", "sentence_written"), 0.93, "firming test"),
    (("eou", "pause_rise"), 0.2, "eager test"),
    (("eou", "pause_rise"), 0.75, "eager test"),
    (("confidence", "wrong"), 0.85, "test_confidence.py"),
    (("phrases", "boosted"), 1, "test_phrase_recall.py"),
])
def test_a_model_that_breaks_what_a_test_is_built_on_is_refused(where, value, said):
    check = make_pins().check
    check(demo_pins())  # the bundled model's figures hold every premise
    pins = copy.deepcopy(demo_pins())
    pins[where[0]][where[1]] = value
    with pytest.raises(SystemExit, match=said):
        check(pins)

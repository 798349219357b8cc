"""`--dtype auto`: the choice as a function of measured figures, and the check on a real model."""

from __future__ import annotations

import logging

import pytest
import torch

from parakeet_stream.engine import ASREngine
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.precision import set_precision
from parakeet_stream.model import precision_check
from parakeet_stream.model.precision_check import MAX_ERROR, MIN_AGREEMENT, Trial, choose

F32 = 0.100  # float32's encoder step, seconds


def trial(dtype: str = "bfloat16", agreement: float = 1.0, error: float = 0.01, seconds: float = 0.035) -> Trial:
    return Trial(dtype, agreement, error, seconds)


def test_a_candidate_that_keeps_tokens_and_is_faster_is_chosen():
    dtype, reason = choose(F32, [trial()])
    assert dtype == "bfloat16" and "2.9x faster" in reason and "100.0% of frames agree" in reason


@pytest.mark.parametrize("bad,why", [
    (trial(agreement=MIN_AGREEMENT - 0.01), "changes decisions"),
    (trial(error=MAX_ERROR * 2), "changes decisions"),
    (trial(error=float("inf")), "changes decisions"),
    (trial(seconds=0.095), "is not faster"),  # within the 10% a timing may be off by
    (trial(seconds=0.3), "is not faster"),  # emulated: slower
])
def test_a_candidate_that_changes_tokens_or_is_not_faster_is_not_chosen(bad, why):
    dtype, reason = choose(F32, [bad])
    assert dtype == "float32" and reason.startswith(f"bfloat16 {why}")


def test_no_candidate_means_float32():
    assert choose(F32, []) == ("float32", "no reduced precision to try on this device")


def test_a_later_candidate_wins_only_where_it_is_measurably_faster():
    bf16, fp16 = trial("bfloat16", seconds=0.05), trial("float16", seconds=0.048)
    assert choose(F32, [bf16, fp16])[0] == "bfloat16"  # as fast: the first (bfloat16's range) wins
    assert choose(F32, [bf16, trial("float16", seconds=0.03)])[0] == "float16"
    assert choose(F32, [trial("bfloat16", agreement=0.5), fp16])[0] == "float16"


def test_auto_on_the_tiny_model_makes_a_valid_choice_and_logs_why(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, logger="parakeet_stream.model.precision")
    model = set_precision(ParakeetModel.from_dir(tiny_model_dir), "auto")
    choice = model.precision
    assert choice.dtype in ("float32", "bfloat16") and model.encoder_dtype == getattr(torch, choice.dtype)
    assert choice.float32_seconds > 0 and [t.dtype for t in choice.trials] == ["bfloat16"]
    assert choice.reason and 0 < choice.check_seconds < 30
    (line,) = [r.getMessage() for r in caplog.records if "--dtype auto" in r.getMessage()]
    assert line.startswith(f"encoder precision: {choice.dtype} (--dtype auto: ") and choice.reason in line
    assert next(p for p in model.encoder.parameters()).dtype == model.encoder_dtype


def test_the_engine_reports_its_precision_and_float32_stays_the_api_default(tiny_model_dir):
    with ASREngine(tiny_model_dir, max_num_streams=1) as engine:
        assert engine.info.precision.dtype == "float32" and engine.info.precision.reason == "asked for"
    with ASREngine(tiny_model_dir, max_num_streams=1, dtype="auto") as engine:
        assert engine.info.precision.trials and engine.info.precision.summary()["dtype"] == engine.info.precision.dtype


def test_auto_with_int8_is_a_quantized_float32_encoder(tiny_model_dir):
    model = set_precision(ParakeetModel.from_dir(tiny_model_dir), "auto", "int8")
    assert model.encoder_dtype == torch.float32 and model.precision.reason == "asked for, int8-quantized"


def test_a_candidate_that_fails_to_run_is_not_chosen(tiny_model_dir, monkeypatch):
    measure = precision_check._step_seconds

    def no_kernel(encoder, dtype, device, give_up=None):
        if dtype != torch.float32:
            raise RuntimeError("no kernel for this dtype")
        return measure(encoder, dtype, device, give_up)

    monkeypatch.setattr(precision_check, "_step_seconds", no_kernel)
    model = set_precision(ParakeetModel.from_dir(tiny_model_dir), "auto")
    assert model.encoder_dtype == torch.float32 and model.precision.reason.startswith("bfloat16 changes decisions")

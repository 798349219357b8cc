"""The encoder's precision: chosen by a measured check (`auto`, the servers' default) or asked
for, and refused where the device cannot run it.

Only the encoder changes precision (it holds nearly all the weights and the time); features,
the prediction network and the joint stay float32, so greedy decisions see float32 logits.
float32 is the one that is token-exact with NeMo (the parity tests run it, and ASREngine's
default is it); `auto` runs the fastest reduced precision that keeps float32's tokens on this
device (precision_check.py), else float32. On a GPU, float32 really is float32: TF32 (on by
default for cuDNN convolutions and LSTMs) is turned off.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from .packed import can_pack, pack_linears
from .precision_check import PrecisionChoice, check

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTO = "auto"
QUANTIZE = ("int8",)


class PrecisionError(ValueError):
    pass


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise PrecisionError(f"unsupported dtype {dtype} (choose {', '.join(DTYPES)})")
        return dtype
    if dtype not in DTYPES:
        raise PrecisionError(f"unknown dtype {dtype!r} (choose {', '.join(DTYPES)})")
    return DTYPES[dtype]


def check_precision(device: torch.device, dtype: str | torch.dtype, quantize: str | None) -> None:
    """Raise PrecisionError with a one-line reason where `device` cannot run the mode (`auto`: only
    the quantization is checked; with one, auto is float32)."""
    dtype = torch.float32 if dtype == AUTO and quantize else dtype
    if dtype != AUTO:
        dtype = parse_dtype(dtype)
    if quantize is not None and quantize not in QUANTIZE:
        raise PrecisionError(f"unknown quantization {quantize!r} (choose {', '.join(QUANTIZE)})")
    if quantize == "int8":
        if device.type != "cpu":
            raise PrecisionError("--quantize int8 (dynamic int8 matmuls) runs on CPU only; use --dtype bfloat16 on GPUs")
        if dtype != torch.float32:
            raise PrecisionError("--quantize int8 quantizes a float32 encoder: leave --dtype at float32")
        if torch.backends.quantized.engine in (None, "none"):
            raise PrecisionError("this torch build has no quantized CPU kernels (fbgemm/onednn/x86)")
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise PrecisionError(f"{torch.cuda.get_device_name(device)} has no bfloat16 support: use --dtype float16")


def set_precision(model, dtype: str | torch.dtype = torch.float32, quantize: str | None = None):
    """Cast (or quantize) `model.encoder` in place; sets `model.encoder_dtype` (the dtype of its
    activations) and `model.precision` (a PrecisionChoice: what was chosen, and why)."""
    device = model.features.fb.device
    check_precision(device, dtype, quantize)
    choice = _choose(model, dtype, quantize)
    dtype = parse_dtype(choice.dtype)
    if device.type == "cuda":  # process-wide: the float32 parts (all of them in float32 mode) stay float32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model.encoder.to(dtype)
    if quantize == "int8":
        with warnings.catch_warnings():  # torch.ao's dynamic quantization warns that it moves to torchao
            warnings.simplefilter("ignore")
            model.encoder = torch.ao.quantization.quantize_dynamic(model.encoder, {nn.Linear}, dtype=torch.qint8)
    elif can_pack(device, dtype):
        pack_linears(model.encoder)
    model.encoder_dtype = dtype
    model.precision = choice
    return model


def _choose(model, dtype: str | torch.dtype, quantize: str | None) -> PrecisionChoice:
    """What `dtype` asks for: `auto` runs the check on a float32 encoder; a dtype the encoder
    already has keeps the choice that gave it (parakeet-transcribe sets the model up before its engine)."""
    if dtype == AUTO and quantize is None and model.encoder_dtype == torch.float32:
        choice = check(model)
        log.info("encoder precision: %s (--dtype auto: %s; the check took %.2f s)", choice.dtype, choice.reason,
                 choice.check_seconds)
        return choice
    if dtype == AUTO:  # with a quantization float32; an encoder already cast keeps its precision
        dtype = torch.float32 if quantize else model.encoder_dtype
    dtype = parse_dtype(dtype)
    kept = model.precision
    if kept is not None and dtype == model.encoder_dtype and parse_dtype(kept.dtype) == dtype:
        return kept
    name = str(dtype).removeprefix("torch.")
    return PrecisionChoice(name, "asked for" if quantize is None else f"asked for, {quantize}-quantized")

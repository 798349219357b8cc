"""Reduced-precision modes: each runs end to end, agrees with float32, and is refused where it cannot run."""

import difflib
import subprocess
import sys

import pytest
import torch
from helpers import run_stream, tokens_of

from parakeet_stream.engine import ASREngine
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.packed import PackedLinear, can_pack
from parakeet_stream.model.precision import PrecisionError, check_precision, parse_dtype, set_precision

MODES = [("bfloat16", None), ("float16", None), ("float32", "int8")]


def agreement(a: list[int], b: list[int]) -> float:
    """Share of tokens matched between two token sequences (1.0 = identical)."""
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()


@pytest.fixture(scope="module")
def fp32_tokens(tiny_model_dir, wavs):
    with ASREngine(tiny_model_dir, max_num_streams=4) as engine:
        return {name: tokens_of(run_stream(engine, audio)) for name, audio in wavs.items()}


@pytest.mark.parametrize("dtype,quantize", MODES)
def test_mode_runs_end_to_end_and_agrees_with_float32(tiny_model_dir, wavs, fp32_tokens, dtype, quantize):
    with ASREngine(tiny_model_dir, max_num_streams=4, dtype=dtype, quantize=quantize) as engine:
        assert engine.model.encoder_dtype == parse_dtype(dtype)
        assert engine.runner.cache.keys.dtype == parse_dtype(dtype)
        for name, audio in wavs.items():
            tokens = tokens_of(run_stream(engine, audio))
            assert tokens, name
            assert agreement(tokens, fp32_tokens[name]) >= 0.9, name


def test_int8_quantizes_the_encoder_linears(tiny_model_dir):
    with ASREngine(tiny_model_dir, max_num_streams=1, quantize="int8") as engine:
        linears = [type(m).__module__ for m in engine.model.encoder.modules() if type(m).__name__ == "Linear"]
    assert linears and all("quantized" in where for where in linears)


@pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16), reason="no native bfloat16 oneDNN on this CPU")
def test_bfloat16_on_cpu_packs_the_encoder_linears_and_gives_the_same_bits(tiny_model_dir, wavs):
    plain = ParakeetModel.from_dir(tiny_model_dir)
    plain.encoder.to(torch.bfloat16)
    packed = set_precision(ParakeetModel.from_dir(tiny_model_dir), "bfloat16")
    assert not [m for m in packed.encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert [m for m in packed.encoder.modules() if isinstance(m, PackedLinear)]
    with torch.inference_mode():
        feats, valid = plain.features(torch.from_numpy(wavs["sentence"]))
        feats, lengths = feats[None].to(torch.bfloat16), torch.tensor([valid])
        assert torch.equal(plain.encoder(feats, lengths)[0], packed.encoder(feats, lengths)[0])


@pytest.mark.parametrize("device,dtype,quantize,message", [
    ("cuda", torch.float32, "int8", "CPU only"),
    ("cpu", torch.bfloat16, "int8", "leave --dtype at float32"),
    ("cpu", torch.float32, "int4", "unknown quantization"),
])
def test_unsupported_modes_are_refused(device, dtype, quantize, message):
    with pytest.raises(PrecisionError, match=message):
        check_precision(torch.device(device), dtype, quantize)


def test_unknown_dtype_is_refused():
    with pytest.raises(PrecisionError, match="unknown dtype"):
        parse_dtype("float8")


def test_serve_refuses_an_unsupported_mode_in_one_line(tiny_model_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "parakeet_stream.server.cli", "--model", str(tiny_model_dir), "--dtype", "bfloat16",
         "--quantize", "int8", "--port", "0", "--ws-port", "0", "--http-port", "0", "--grpc-port", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "leave --dtype at float32" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cuda_engine_matches_cpu_tokens(tiny_model_dir, wavs, fp32_tokens, dtype):
    with ASREngine(tiny_model_dir, device="cuda", max_num_streams=4, dtype=dtype) as engine:
        for name, audio in wavs.items():
            tokens = tokens_of(run_stream(engine, audio))
            assert agreement(tokens, fp32_tokens[name]) >= (1.0 if dtype == "float32" else 0.9), name


def test_precision_leaves_decoder_in_float32(tiny_model_dir):
    model = ParakeetModel.from_dir(tiny_model_dir)
    with ASREngine(model, max_num_streams=1, dtype="bfloat16") as engine:
        assert engine.model.decoder.joint.out.weight.dtype == torch.float32
        assert engine.model.features.fb.dtype == torch.float32

"""Full-size structure (random weights, no download) and conversion of NeMo-named state dicts."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import torch
import yaml
from conftest import NEMO

from parakeet_stream.model.config import ModelConfig, UnsupportedModel
from parakeet_stream.model.convert import ConvertError, map_state_dict
from parakeet_stream.tools.convert import convert
from parakeet_stream.model.parakeet import ParakeetModel

FULL = json.loads((NEMO / "full_size_keys.json").read_text())


def nemo_config(name: str) -> dict:
    return yaml.safe_load((NEMO / f"{name}_model_config.yaml").read_text())


@pytest.mark.parametrize("name,layers,modes", [
    ("small", 17, [(70, 1)]),
    ("large", 24, [(70, 13), (70, 6), (70, 1), (70, 0)]),
    ("multilingual", 24, [(56, 13), (56, 6), (56, 3), (56, 1), (56, 0)]),  # prompt_kernel 1152 -> 2048 -> 1024
])
def test_full_size_config_and_parameter_count(name, layers, modes):
    cfg = ModelConfig.from_nemo(nemo_config(name))
    assert cfg.encoder.n_layers == layers
    assert list(cfg.encoder.att_context_sizes) == modes
    model = ParakeetModel(cfg)
    ours = sum(p.numel() for p in model.parameters())
    assert ours == FULL[name]["param_count"]  # NeMo's own count (about 115M / 618M)
    state = {k: torch.zeros(shape) for k, shape in FULL[name]["state_dict"].items()}
    model.load_state_dict(map_state_dict(state, cfg), strict=True)
    del model, state


def test_missing_or_unexpected_keys_are_refused():
    cfg = ModelConfig.from_nemo(nemo_config("small"))
    state = {k: torch.zeros(shape) for k, shape in FULL["small"]["state_dict"].items()}
    state.pop("joint.joint_net.2.weight")
    state["encoder.extra.weight"] = torch.zeros(1)
    with pytest.raises(ConvertError, match="missing decoder.joint.out.weight.*unexpected encoder.extra.weight"):
        map_state_dict(state, cfg)


@pytest.mark.parametrize("edit,reason", [
    (lambda c: c.pop("decoder"), "CTC-only"),
    (lambda c: c["decoding"].update(model_type="tdt"), "TDT"),
    (lambda c: c["encoder"].update(att_context_style="regular"), "not cache-aware"),
    (lambda c: c["encoder"].update(causal_downsampling=False), "not causal"),
])
def test_unsupported_architectures_are_named(edit, reason):
    cfg = nemo_config("small")
    cfg.setdefault("decoding", {})
    edit(cfg)
    with pytest.raises(UnsupportedModel, match=reason):
        ModelConfig.from_nemo(cfg)


def _nemo_archive(path, cfg: dict, state: dict, tokenizer: bytes = b"tok") -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in [("model_config.yaml", yaml.safe_dump(cfg).encode()),
                           ("model_weights.ckpt", _pickled(state)), ("tokenizer.model", tokenizer)]:
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _pickled(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_convert_errors_leave_nothing_behind(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(ConvertError, match="no such file"):
        convert(str(tmp_path / "missing.nemo"), dst)
    (tmp_path / "junk.nemo").write_bytes(b"not a tar")
    with pytest.raises(ConvertError, match="not a .nemo archive"):
        convert(str(tmp_path / "junk.nemo"), dst)
    cfg = nemo_config("small")
    cfg["encoder"]["att_context_style"] = "regular"
    _nemo_archive(tmp_path / "offline.nemo", cfg, {})
    with pytest.raises(ConvertError, match="unsupported model"):
        convert(str(tmp_path / "offline.nemo"), dst)
    _nemo_archive(tmp_path / "evil.nemo", nemo_config("small"), {"x": ConvertError("pickled object")})
    with pytest.raises(ConvertError, match="not a plain tensor checkpoint"):
        convert(str(tmp_path / "evil.nemo"), dst)
    assert not dst.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_exit_code_and_one_line_error(tmp_path, capsys):
    from parakeet_stream.tools.convert import main

    assert main([str(tmp_path / "nope.nemo"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0]

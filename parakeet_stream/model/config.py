"""Model configuration, read from a NeMo `model_config.yaml` or our own `config.json`.

Only the structure we serve is accepted: a cache-aware FastConformer encoder (causal
dw_striding subsampling, rel_pos attention with chunked_limited context, causal depthwise
convolutions, layer norm) with an LSTM prediction network and an RNN-T joint, optionally with
language-ID prompt conditioning between the encoder and the joint (NeMo's
EncDecRNNTBPEModelWithPrompt, nvidia/nemotron-3.5-asr-streaming-0.6b).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path


class UnsupportedModel(ValueError):
    """The checkpoint is a model architecture this server does not run."""


Lookahead = tuple[int, int]


def parse_lookahead(value: object) -> Lookahead:
    """'L,R' (the --lookahead flag, a URL or a message) or [L, R] (JSON) -> (L, R): attention
    context frames left and right. ValueError says what it expects."""
    if isinstance(value, str):
        parts = value.split(",")
        value = [int(p.strip()) if p.strip().isascii() and p.strip().isdigit() and len(p.strip()) <= 9 else None
                 for p in parts]
    if not isinstance(value, list) or len(value) != 2 or not all(type(p) is int and p >= 0 for p in value):
        raise ValueError("expected 'L,R' such as 70,1")
    return value[0], value[1]


@dataclass(frozen=True)
class FeatureConfig:
    sample_rate: int = 16000
    n_mels: int = 128
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    preemph: float = 0.97
    log_guard: float = 2**-24
    mag_power: float = 2.0
    pad_to: int = 0


@dataclass(frozen=True)
class EncoderConfig:
    feat_in: int = 128
    n_layers: int = 17
    d_model: int = 512
    n_heads: int = 8
    ff_expansion: int = 4
    subsampling_factor: int = 8
    subsampling_channels: int = 256
    conv_kernel_size: int = 9
    xscaling: bool = False
    use_bias: bool = False
    pos_emb_max_len: int = 5000
    att_context_sizes: tuple[Lookahead, ...] = ((70, 1),)

    def check_lookahead(self, lookahead: Lookahead | None) -> Lookahead:
        """`lookahead` as one of the modes (None: the first); ValueError names the modes."""
        if lookahead is None:
            return self.att_context_sizes[0]
        lookahead = (int(lookahead[0]), int(lookahead[1]))
        if lookahead not in self.att_context_sizes:
            modes = ", ".join(f"{a},{b}" for a, b in self.att_context_sizes)
            raise ValueError(f"lookahead {lookahead[0]},{lookahead[1]} is not one of this model's modes ({modes})")
        return lookahead


@dataclass(frozen=True)
class DecoderConfig:
    num_classes: int = 1026  # output classes without blank; blank id == num_classes
    pred_hidden: int = 640
    pred_rnn_layers: int = 1
    joint_hidden: int = 640
    max_symbols: int = 10


@dataclass(frozen=True)
class PromptConfig:
    """Language-ID prompts: the one-hot of a prompt index joins every encoder frame, and a
    two-layer network maps the pair back to d_model before the joint (model/prompt.py)."""

    num_prompts: int = 128
    languages: dict[str, int] = field(default_factory=dict)  # prompt name ('en-US', 'auto') -> index

    def index(self, language: str) -> int:
        """The prompt index of a language name; ValueError names the choices."""
        if language not in self.languages:
            raise ValueError(f"unknown language {language!r}: expected one of {', '.join(self.languages)}")
        return self.languages[language]


@dataclass(frozen=True)
class ModelConfig:
    features: FeatureConfig = field(default_factory=FeatureConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    prompt: PromptConfig | None = None  # a model without language prompts has none

    @property
    def default_lookahead(self) -> Lookahead:
        return self.encoder.att_context_sizes[0]

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        if self.prompt is None:  # the config.json of a model without prompts stays as it was
            del d["prompt"]
        return json.dumps(d, indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        enc = dict(d["encoder"])
        enc["att_context_sizes"] = tuple(tuple(m) for m in enc["att_context_sizes"])
        prompt = PromptConfig(**d["prompt"]) if d.get("prompt") else None
        return cls(FeatureConfig(**d["features"]), EncoderConfig(**enc), DecoderConfig(**d["decoder"]), prompt)

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_nemo(cls, cfg: dict) -> "ModelConfig":
        """Build from a NeMo model_config.yaml dict; raises UnsupportedModel with the reason."""
        return cls(_features_from_nemo(cfg), _encoder_from_nemo(cfg), _decoder_from_nemo(cfg), _prompt_from_nemo(cfg))


def _require(ok: bool, why: str) -> None:
    if not ok:
        raise UnsupportedModel(why)


def _features_from_nemo(cfg: dict) -> FeatureConfig:
    pre = cfg.get("preprocessor") or {}
    _require("MelSpectrogram" in str(pre.get("_target_", "")), "preprocessor is not a log-mel spectrogram")
    _require(str(pre.get("normalize", "NA")) in ("NA", "None", "none", ""), f"feature normalize={pre.get('normalize')!r} is not supported")
    _require(str(pre.get("window", "hann")) == "hann", "only hann windows are supported")
    _require(int(pre.get("frame_splicing", 1)) == 1, "frame splicing is not supported")
    _require(not pre.get("exact_pad", False), "exact_pad STFT is not supported")
    _require(pre.get("log", True) and pre.get("log_zero_guard_type", "add") == "add", "only log(x + guard) features are supported")
    sr = int(pre.get("sample_rate", 16000))
    pad_to = pre.get("pad_to", 16)
    _require(isinstance(pad_to, int), f"pad_to={pad_to!r} is not supported")
    guard = pre.get("log_zero_guard_value", 2**-24)
    _require(isinstance(guard, (int, float)), f"log_zero_guard_value={guard!r} is not supported")
    return FeatureConfig(
        sample_rate=sr,
        n_mels=int(pre.get("features", 64)),
        n_fft=int(pre.get("n_fft") or 512),
        win_length=round(float(pre.get("window_size", 0.02)) * sr),
        hop_length=round(float(pre.get("window_stride", 0.01)) * sr),
        preemph=float(pre.get("preemph", 0.97) or 0.0),
        log_guard=float(guard),
        mag_power=float(pre.get("mag_power", 2.0)),
        pad_to=pad_to,
    )


def _lookaheads(att: list) -> tuple[Lookahead, ...]:
    modes = att if att and isinstance(att[0], (list, tuple)) else [att]
    out = tuple((int(m[0]), int(m[1])) for m in modes)
    for left, right in out:
        _require(left >= 0 and right >= 0, f"att_context_size {[left, right]} is not a bounded streaming context")
        _require(left % (right + 1) == 0, f"att_context_size {[left, right]}: left context must be whole chunks")
    return out


def _encoder_from_nemo(cfg: dict) -> EncoderConfig:
    enc = cfg.get("encoder") or {}
    _require("ConformerEncoder" in str(enc.get("_target_", "")), f"encoder {enc.get('_target_')!r} is not a FastConformer encoder")
    _require(enc.get("att_context_style") == "chunked_limited", "encoder is not cache-aware streaming (att_context_style is not chunked_limited)")
    _require(bool(enc.get("causal_downsampling")), "encoder subsampling is not causal (not a streaming model)")
    _require(enc.get("subsampling") == "dw_striding", f"subsampling {enc.get('subsampling')!r} is not supported")
    _require(enc.get("self_attention_model", "rel_pos") == "rel_pos", "only rel_pos self-attention is supported")
    _require(str(enc.get("conv_context_size")) in ("causal", f"[{int(enc.get('conv_kernel_size', 9)) - 1}, 0]"), "convolutions are not causal (not a streaming model)")
    _require(enc.get("conv_norm_type", "batch_norm") == "layer_norm", f"conv_norm_type {enc.get('conv_norm_type')!r} is not supported")
    _require(not enc.get("reduction"), "time reduction layers are not supported")
    return EncoderConfig(
        feat_in=int(enc["feat_in"]),
        n_layers=int(enc["n_layers"]),
        d_model=int(enc["d_model"]),
        n_heads=int(enc["n_heads"]),
        ff_expansion=int(enc.get("ff_expansion_factor", 4)),
        subsampling_factor=int(enc.get("subsampling_factor", 8)),
        subsampling_channels=int(enc.get("subsampling_conv_channels", -1) if enc.get("subsampling_conv_channels", -1) != -1 else enc["d_model"]),
        conv_kernel_size=int(enc.get("conv_kernel_size", 31)),
        xscaling=bool(enc.get("xscaling", True)),
        use_bias=bool(enc.get("use_bias", True)),
        pos_emb_max_len=int(enc.get("pos_emb_max_len", 5000)),
        att_context_sizes=_lookaheads(enc.get("att_context_size", [-1, -1])),
    )


def _decoder_from_nemo(cfg: dict) -> DecoderConfig:
    dec, joint = cfg.get("decoder"), cfg.get("joint")
    _require(dec is not None and joint is not None, "model has no RNN-T decoder (CTC-only models are not supported)")
    _require("RNNTDecoder" in str(dec.get("_target_", "")), f"decoder {dec.get('_target_')!r} is not an RNN-T LSTM decoder")
    _require("RNNTJoint" in str(joint.get("_target_", "")), f"joint {joint.get('_target_')!r} is not supported")
    model_type = str((cfg.get("decoding") or {}).get("model_type", "rnnt"))
    _require(model_type == "rnnt" and not joint.get("num_extra_outputs"), "TDT models are not supported")
    pred, jnet = dec.get("prednet") or {}, joint.get("jointnet") or {}
    _require(jnet.get("activation", "relu") == "relu", "only relu joint activation is supported")
    greedy = (cfg.get("decoding") or {}).get("greedy") or {}
    return DecoderConfig(
        num_classes=int(joint.get("num_classes", dec.get("vocab_size"))),
        pred_hidden=int(pred.get("pred_hidden", 640)),
        pred_rnn_layers=int(pred.get("pred_rnn_layers", 1)),
        joint_hidden=int(jnet.get("joint_hidden", 640)),
        max_symbols=int(greedy.get("max_symbols", 10) or 10),
    )


def _prompt_from_nemo(cfg: dict) -> PromptConfig | None:
    """EncDecRNNTBPEModelWithPrompt builds its prompt kernel only with
    model_defaults.initialize_prompt_feature; its width is enc_hidden + num_prompts."""
    defaults = cfg.get("model_defaults") or {}
    if not defaults.get("initialize_prompt_feature"):
        return None
    d_model = int((cfg.get("encoder") or {})["d_model"])
    _require(int(defaults.get("enc_hidden", d_model)) == d_model, "prompt kernel width (enc_hidden) is not the encoder's d_model")
    num = int(cfg.get("num_prompts") or defaults.get("num_prompts", 128))
    languages = {str(name): int(i) for name, i in (defaults.get("prompt_dictionary") or {}).items()}
    bad = [name for name, i in languages.items() if not 0 <= i < num]
    _require(not bad, f"prompt_dictionary indices of {bad} are outside 0..{num - 1}")
    return PromptConfig(num_prompts=num, languages=languages)

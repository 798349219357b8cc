"""NVIDIA's Streaming Sortformer diarizer (NeMo's SortformerEncLabelModel): the network.

A FastConformer encoder with non-causal dw_striding subsampling, full-context rel_pos attention and
batch-norm convolutions; a projection to the post-LN Transformer encoder's width; a two-layer head
with one sigmoid per speaker. Streaming (sortformer_streaming.py) runs the subsampling on each chunk
alone and the rest over [speaker cache; FIFO; chunk] of pre-encoded frames. Module names follow
NeMo's, so a `.nemo` checkpoint loads with only the conformer's q/k/v fused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .attention import relative_positions
from .config import EncoderConfig, FeatureConfig, UnsupportedModel, _features_from_nemo
from .conformer import ConformerLayer
from .convert import read_nemo
from .features import LogMelFeatures

MASK_VALUE = -10000.0  # NeMo's additive mask of padded keys in the Transformer encoder


@dataclass(frozen=True)
class StreamingConfig:
    """SortformerModules' streaming parameters, in 80 ms frames (the model card's 1.04 s setting:
    chunk 6, right context 7, FIFO 188, cache 188, update period 144)."""

    chunk_len: int = 6
    chunk_left_context: int = 1
    chunk_right_context: int = 7
    fifo_len: int = 188
    spkcache_len: int = 188
    spkcache_update_period: int = 144
    spkcache_sil_frames_per_spk: int = 3
    pred_score_threshold: float = 0.25
    scores_boost_latest: float = 0.05
    sil_threshold: float = 0.2
    strong_boost_rate: float = 0.75
    weak_boost_rate: float = 1.5
    min_pos_scores_rate: float = 0.5
    max_index: int = 99999


@dataclass(frozen=True)
class SortformerConfig:
    features: FeatureConfig = field(default_factory=FeatureConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    tf_layers: int = 18
    tf_d_model: int = 192
    tf_heads: int = 8
    tf_inner: int = 768
    n_spk: int = 4
    streaming: StreamingConfig = field(default_factory=StreamingConfig)

    @classmethod
    def from_nemo(cls, cfg: dict) -> "SortformerConfig":
        enc, tf, mods = cfg.get("encoder") or {}, cfg.get("transformer_encoder") or {}, cfg.get("sortformer_modules") or {}
        _require("ConformerEncoder" in str(enc.get("_target_", "")), "encoder is not a FastConformer")
        _require(enc.get("subsampling") == "dw_striding" and not enc.get("causal_downsampling"), "subsampling is not non-causal dw_striding")
        _require(enc.get("self_attention_model", "rel_pos") == "rel_pos", "only rel_pos self-attention is supported")
        _require(list(enc.get("att_context_size", [-1, -1])) == [-1, -1], "the encoder's attention is not full-context")
        _require(enc.get("conv_norm_type", "batch_norm") == "batch_norm", "only batch-norm convolutions are supported")
        _require(enc.get("conv_context_size") in (None, "null"), "only centred convolutions are supported")
        _require(enc.get("untie_biases", True), "tied rel_pos biases are not supported")
        _require(not enc.get("reduction"), "time reduction layers are not supported")
        _require(not tf.get("pre_ln", False) and tf.get("hidden_act", "relu") == "relu", "only post-LN relu transformers are supported")
        channels = int(enc.get("subsampling_conv_channels", -1))
        encoder = EncoderConfig(
            feat_in=int(enc["feat_in"]), n_layers=int(enc["n_layers"]), d_model=int(enc["d_model"]),
            n_heads=int(enc["n_heads"]), ff_expansion=int(enc.get("ff_expansion_factor", 4)),
            subsampling_factor=int(enc.get("subsampling_factor", 8)),
            subsampling_channels=channels if channels != -1 else int(enc["d_model"]),
            conv_kernel_size=int(enc.get("conv_kernel_size", 31)), xscaling=bool(enc.get("xscaling", True)),
            use_bias=bool(enc.get("use_bias", True)), att_context_sizes=((-1, -1),),
        )
        _require(encoder.conv_kernel_size % 2 == 1, "the convolution kernel must be odd")
        names = set(StreamingConfig.__dataclass_fields__)
        streaming = StreamingConfig(**{k: type(getattr(StreamingConfig, k))(v) for k, v in mods.items() if k in names})
        return cls(
            features=_features_from_nemo(cfg), encoder=encoder,
            tf_layers=int(tf["num_layers"]), tf_d_model=int(tf["hidden_size"]), tf_heads=int(tf["num_attention_heads"]),
            tf_inner=int(tf["inner_size"]), n_spk=int(mods.get("num_spks", cfg.get("max_num_of_spks", 4))),
            streaming=streaming,
        )


def _require(ok: bool, why: str) -> None:
    if not ok:
        raise UnsupportedModel(why)


def length_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """[B, t] True where a frame is valid."""
    return torch.arange(t, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


class Subsampling(nn.Module):
    """dw_striding 2**k-fold subsampling with centred padding (1 frame each side per stage), valid
    frames only (later ones zeroed before every layer, as NeMo's MaskedConvSequential does)."""

    def __init__(self, feat_in: int, d_model: int, channels: int, factor: int):
        super().__init__()
        self.stages = int(math.log2(factor))
        layers: list[nn.Module] = [nn.Conv2d(1, channels, 3, 2, padding=1), nn.ReLU()]
        for _ in range(self.stages - 1):
            layers += [nn.Conv2d(channels, channels, 3, 2, padding=1, groups=channels), nn.Conv2d(channels, channels, 1), nn.ReLU()]
        self.conv = nn.Sequential(*layers)
        freq = feat_in
        for _ in range(self.stages):
            freq = (freq - 1) // 2 + 1
        self.out = nn.Linear(channels * freq, d_model)

    def out_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        """The valid frames `forward` gives for `lengths` valid input frames."""
        for _ in range(self.stages):
            lengths = (lengths - 1).div(2, rounding_mode="floor") + 1
        return lengths

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        """x [B, T, feat_in], lengths [B] -> (y [B, T', d_model], lengths [B])."""
        x = x.unsqueeze(1)
        for layer in self.conv:
            x = x * length_mask(lengths, x.size(2)).to(x.dtype)[:, None, :, None]
            x = layer(x)
            if isinstance(layer, nn.Conv2d) and layer.stride != (1, 1):
                lengths = (lengths - 1).div(2, rounding_mode="floor") + 1
        x = x * length_mask(lengths, x.size(2)).to(x.dtype)[:, None, :, None]
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)), lengths


class ConvModule(nn.Module):
    """Pointwise conv + GLU, centred depthwise conv (padded frames zeroed first), batch norm, swish, pointwise conv."""

    def __init__(self, d_model: int, kernel: int, bias: bool):
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel, padding=(kernel - 1) // 2, groups=d_model, bias=bias)
        self.batch_norm = nn.BatchNorm1d(d_model)
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, 1, bias=bias)

    def forward(self, x, pad_mask, cache=None):
        """x [B, T, D], pad_mask [B, T] True = padding -> ([B, T, D], None) (ConformerLayer's interface)."""
        h = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)
        h = h.masked_fill(pad_mask.unsqueeze(1), 0.0)
        h = F.silu(self.batch_norm(self.depthwise_conv(h)))
        return self.pointwise_conv2(h).transpose(1, 2), None


class FastConformer(nn.Module):
    """NeMo's ConformerEncoder with att_context_size [-1, -1]: `pre_encode`, then `forward` over
    pre-encoded frames (NeMo's bypass_pre_encode)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.pre_encode = Subsampling(cfg.feat_in, cfg.d_model, cfg.subsampling_channels, cfg.subsampling_factor)
        self.layers = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.n_layers))
        for layer in self.layers:
            layer.conv = ConvModule(cfg.d_model, cfg.conv_kernel_size, cfg.use_bias)
        self.xscale = math.sqrt(cfg.d_model) if cfg.xscaling else None

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Pre-encoded frames x [B, T, D] (valid: the first `lengths`) -> encoded [B, T, D]."""
        if self.xscale:
            x = x * self.xscale
        valid = length_mask(lengths, x.size(1))
        att_mask = ~(valid.unsqueeze(1) & valid.unsqueeze(2))
        pos_emb = relative_positions(x.size(1), self.cfg.d_model, x.device).to(x.dtype)
        for layer in self.layers:
            x, _ = layer(x, pos_emb, att_mask, ~valid)
        return x


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.h = n_heads
        self.query_net = nn.Linear(d_model, d_model)
        self.key_net = nn.Linear(d_model, d_model)
        self.value_net = nn.Linear(d_model, d_model)
        self.out_projection = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x [B, T, D]; bias [B, 1, 1, T] added to the scores (MASK_VALUE at padded keys)."""
        b, t, d = x.shape

        def heads(net):
            return net(x).view(b, t, self.h, d // self.h).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.query_net), heads(self.key_net), heads(self.value_net), attn_mask=bias)
        return self.out_projection(out.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, inner: int):
        super().__init__()
        self.dense_in = nn.Linear(d_model, inner)
        self.dense_out = nn.Linear(inner, d_model)

    def forward(self, x):
        return self.dense_out(F.relu(self.dense_in(x)))


class TransformerLayer(nn.Module):
    """Post-LN: x = LN1(x + attn(x)); x = LN2(x + ff(x))."""

    def __init__(self, d_model: int, n_heads: int, inner: int):
        super().__init__()
        self.first_sub_layer = MultiHeadAttention(d_model, n_heads)
        self.layer_norm_1 = nn.LayerNorm(d_model)
        self.second_sub_layer = FeedForward(d_model, inner)
        self.layer_norm_2 = nn.LayerNorm(d_model)

    def forward(self, x, bias):
        x = self.layer_norm_1(x + self.first_sub_layer(x, bias))
        return self.layer_norm_2(x + self.second_sub_layer(x))


class TransformerEncoder(nn.Module):
    def __init__(self, n_layers: int, d_model: int, n_heads: int, inner: int):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(d_model, n_heads, inner) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros(valid.shape, dtype=x.dtype, device=x.device).masked_fill(~valid, MASK_VALUE)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        return x


class SpeakerHead(nn.Module):
    """NeMo's SortformerModules' weights: encoder_proj (when the widths differ) and the sigmoid head."""

    def __init__(self, fc_d_model: int, tf_d_model: int, n_spk: int):
        super().__init__()
        self.encoder_proj = nn.Linear(fc_d_model, tf_d_model) if fc_d_model != tf_d_model else None
        self.first_hidden_to_hidden = nn.Linear(tf_d_model, tf_d_model)
        self.single_hidden_to_spks = nn.Linear(tf_d_model, n_spk)

    def project(self, x):
        return self.encoder_proj(x) if self.encoder_proj is not None else x

    def forward(self, x):
        return torch.sigmoid(self.single_hidden_to_spks(F.relu(self.first_hidden_to_hidden(F.relu(x)))))


class Sortformer(nn.Module):
    def __init__(self, cfg: SortformerConfig):
        super().__init__()
        self.cfg = cfg
        self.features = LogMelFeatures(cfg.features)
        self.encoder = FastConformer(cfg.encoder)
        self.transformer_encoder = TransformerEncoder(cfg.tf_layers, cfg.tf_d_model, cfg.tf_heads, cfg.tf_inner)
        self.sortformer_modules = SpeakerHead(cfg.encoder.d_model, cfg.tf_d_model, cfg.n_spk)

    def speaker_probs(self, pre_encoded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Pre-encoded frames [B, T, D] (valid: the first `lengths`) -> speaker probabilities
        [B, T, n_spk], zero at padded frames."""
        valid = length_mask(lengths, pre_encoded.size(1))
        x = self.sortformer_modules.project(self.encoder(pre_encoded, lengths))
        x = self.transformer_encoder(x, valid)
        return self.sortformer_modules(x) * valid.unsqueeze(-1).to(x.dtype)

    @classmethod
    def from_nemo(cls, path: str | Path) -> "Sortformer":
        cfg_dict, state, _ = read_nemo(Path(path), tokenizer=False)
        model = cls(SortformerConfig.from_nemo(cfg_dict))
        model.load_state_dict(map_state_dict(state, model.cfg.encoder.n_layers))
        return model.eval()


def map_state_dict(nemo: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """NeMo's names -> ours: q/k/v of each conformer layer fused, the preprocessor's filterbank and
    window kept, NeMo's unused or recomputed tensors dropped."""
    out = {}
    for key, value in nemo.items():
        if key.endswith("num_batches_tracked") or key == "encoder.pos_enc.pe" or key.startswith("sortformer_modules.hidden_to_spks."):
            continue
        if key.startswith("preprocessor.featurizer."):
            name = key.removeprefix("preprocessor.featurizer.")
            if name == "fb":
                out["features.fb"] = value.reshape(value.shape[-2], value.shape[-1])
            elif name == "window":
                out["features.window"] = value
            continue
        if ".self_attn.linear_q." in key or ".self_attn.linear_k." in key or ".self_attn.linear_v." in key:
            continue
        out[key] = value
    for i in range(n_layers):
        for kind in ("weight", "bias"):
            parts = [nemo.get(f"encoder.layers.{i}.self_attn.linear_{p}.{kind}") for p in "qkv"]
            if all(p is not None for p in parts):
                out[f"encoder.layers.{i}.self_attn.qkv.{kind}"] = torch.cat(parts)
    return out

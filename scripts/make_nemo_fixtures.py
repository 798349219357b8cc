#!/usr/bin/env python3
"""Generate NeMo reference fixtures for parakeet_stream's model-fidelity tests.

This is the ONLY place in the project that imports NeMo. It builds tiny random-init
NeMo ``EncDecRNNTBPEModel``s with the real structural options of the two served model
families (from the model_config.yaml in NVIDIA's checkpoints on Hugging Face,
nvidia/parakeet_realtime_eou_120m-v1 and nvidia/nemotron-speech-streaming-en-0.6b; the full-size
configurations built from them are kept as tests/fixtures/nemo/{small,large}_model_config.yaml),
and a tiny ``EncDecRNNTBPEModelWithPrompt`` for the multilingual family
(nvidia/nemotron-3.5-asr-streaming-0.6b: left context 56, five lookahead modes, language-ID
prompts, language-tag pieces; decoded once per prompt, after ``set_inference_prompt``),
shapes their weights so every greedy decision has a wide logit margin, runs NeMo's own
cache-aware streaming (exactly as
examples/asr/asr_cache_aware_streaming/speech_to_text_cache_aware_streaming_infer.py does) and its
offline forward, and writes everything the tests need to compare our own PyTorch
re-implementation token for token, without NeMo installed.

Outputs (committed):

  tests/fixtures/audio/{sentence,pause,noise}.wav   16 kHz mono PCM16 (espeak-ng)
  tests/fixtures/audio/texts.json                   what was spoken
  tests/fixtures/nemo/eou_tiny.nemo                 parakeet_realtime_eou_120m-v1 structure, tiny
  tests/fixtures/nemo/nemotron_tiny.nemo            nemotron-speech-streaming-en-0.6b structure, tiny
  tests/fixtures/nemo/reference.json                tokens, per-chunk tokens, streaming cfg, margins
  tests/fixtures/nemo/reference.safetensors         features / encoder outputs (float32)
  tests/fixtures/nemo/full_size_keys.json           state_dict key -> shape of the full-size models
  tests/fixtures/nemo/{small,large,multilingual}_model_config.yaml  model_config.yaml NeMo writes for them
  tests/fixtures/nemo/prompt_tiny.nemo              nemotron-3.5-asr-streaming-0.6b structure, tiny
  tests/fixtures/nemo/prompt_reference.{json,safetensors}  the same records per prompt, plus NeMo's text

Set up NeMo in its own venv, OUTSIDE the repo (it is never a project dependency); NEMO_VENV is
any folder of your choice:

    NEMO_VENV=~/nemo-venv
    python3 -m venv $NEMO_VENV
    $NEMO_VENV/bin/pip install -U pip
    $NEMO_VENV/bin/pip install torch==2.13.0                  # the CPU build the project is pinned to
    echo 'torch==2.13.0' > $NEMO_VENV/torch-constraint.txt    # keep pip from pulling a CUDA torch
    $NEMO_VENV/bin/pip install -c $NEMO_VENV/torch-constraint.txt "nemo_toolkit[asr]==3.0.0"
    apt-get install -y espeak-ng                              # test speech

How the tiny models get wide margins: random weights decode to near-ties, so after a random
init (LayerNorm gains/biases and pos_bias_u/v randomised too) the prediction net + joint are
trained (encoder untouched) on a fixed target path - blank in silence, a few tokens per second
in speech chosen from the encoder frame, <EOU> once after speech for the EOU family - with a
multi-class hinge loss until every greedy argmax decision over every decoded utterance wins by
>= 1.2 logits. The result is checked on the saved + restored .nemo: a plain frame-loop greedy
decoder over NeMo's own encoder outputs must reproduce NeMo's tokens exactly, and its smallest
top1-top2 gap is recorded in reference.json.

Run from the repo root (5-30 minutes on a busy 2-core machine, almost all of it the margin
training; the full-size builds take well under a minute):

    $NEMO_VENV/bin/python scripts/make_nemo_fixtures.py
    $NEMO_VENV/bin/python scripts/make_nemo_fixtures.py --skip-full-size   # tiny fixtures only
    # the prompt family alone, on the committed wavs (its files only; full_size_keys.json gains
    # or replaces its "multilingual" entry); the committed one: --seed 1 (seed 0 left a decision
    # short of its margin)
    $NEMO_VENV/bin/python scripts/make_nemo_fixtures.py --family prompt_tiny --seed 1

Everything is seeded. The target token paths are fully determined by the seed and the wavs;
the trained weights (hence the recorded margins) are not bit-reproducible across runs
(multithreaded CPU training). espeak-ng output can differ between espeak-ng versions, so
regenerate all fixtures together (the wavs are the inputs of every reference number).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
AUDIO_DIR = REPO / "tests" / "fixtures" / "audio"
NEMO_DIR = REPO / "tests" / "fixtures" / "nemo"
SR = 16000

# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------

SPEECH = {
    "sentence": ["The quick brown fox jumps over the lazy dog."],
    "pause": ["Hello there, how are you today?", "I am fine, thank you very much."],
    "noise": ["She sells sea shells by the sea shore."],
}
PAUSE_SECONDS = 1.5
NOISE_SNR_DB = 15.0
NOISE_SEED = 1234
WAV_NAMES = ["sentence", "pause", "noise"]

# Tokenizer training text (written for this project; plain English, mixed case + punctuation).
CORPUS = """\
The quick brown fox jumps over the lazy dog.
Hello there, how are you today? I am fine, thank you very much.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
Streaming speech recognition turns audio into words while the person is still speaking.
Every stream sends small packets of sound, and the server answers with text.
When the speaker stops talking, the model marks the end of the utterance.
A small model runs on a laptop; a large model runs on a graphics card.
Please call Stella and ask her to bring these things with her from the store.
Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob.
We also need a small plastic snake and a big toy frog for the kids.
She can scoop these things into three red bags, and we will go meet her Wednesday at the train station.
The weather today is cold and windy, with a chance of rain in the evening.
Numbers like one, two, three, four, five, six, seven, eight, nine and ten are spoken often.
What time is it? It is half past nine in the morning.
Could you repeat that, please? I did not hear the last word.
The meeting starts at noon, so we should leave the office before eleven thirty.
Good morning, everyone. Let us begin with a short summary of last week.
The river flows quietly past the old mill and under the stone bridge.
Birds were singing in the garden when the sun came up over the hills.
He opened the window, looked outside, and decided to take a long walk.
Reading books in the library is a quiet and pleasant way to spend an afternoon.
The children laughed and played in the park until it was time to go home.
Turn left at the next corner, then walk straight for two hundred meters.
Thank you for calling. Your call is important to us. Please hold the line.
Can you hear me now? Yes, I can hear you clearly.
The train to the city leaves from platform four at a quarter to eight.
Water boils at one hundred degrees and freezes at zero.
My favourite colours are green, blue and yellow, but I also like orange.
They built a small wooden house near the lake and lived there for many years.
Learning a new language takes time, patience and a lot of practice.
"""

# ---------------------------------------------------------------------------------------------
# Model families (structure from the reference doc; sizes tiny)
# ---------------------------------------------------------------------------------------------

TINY = {
    "eou_tiny": dict(
        eou=True,
        n_layers=2,
        d_model=64,
        n_heads=4,
        conv_channels=32,
        att_context_size=[70, 1],
        pred_hidden=48,
        pred_rnn_layers=1,
        joint_hidden=48,
        vocab=128,
    ),
    "nemotron_tiny": dict(
        eou=False,
        n_layers=2,
        d_model=64,
        n_heads=4,
        conv_channels=32,
        att_context_size=[[70, 13], [70, 6], [70, 1], [70, 0]],
        pred_hidden=48,
        pred_rnn_layers=2,
        joint_hidden=48,
        vocab=128,
    ),
}
FULL = {
    "small": dict(
        eou=True,
        n_layers=17,
        d_model=512,
        n_heads=8,
        conv_channels=256,
        att_context_size=[70, 1],
        pred_hidden=640,
        pred_rnn_layers=1,
        joint_hidden=640,
        vocab=1024,
    ),
    "large": dict(
        eou=False,
        n_layers=24,
        d_model=1024,
        n_heads=8,
        conv_channels=256,
        att_context_size=[[70, 13], [70, 6], [70, 1], [70, 0]],
        pred_hidden=640,
        pred_rnn_layers=2,
        joint_hidden=640,
        vocab=1024,
    ),
}
# The multilingual family (nvidia/nemotron-3.5-asr-streaming-0.6b: NeMo's
# EncDecRNNTBPEModelWithPrompt): the English large structure with left context 56, five
# lookahead modes and language-ID prompt conditioning. Its fixtures are written to their own
# files (prompt_tiny.nemo, prompt_reference.*) by `--family prompt_tiny`, so the two families
# above keep theirs byte for byte. Structure values are third-party facts about the released
# checkpoint (its model_config.yaml was not read here); the mode order and the prompt
# dictionary of the full-size dump are illustrative.
PROMPT_MODES = [[56, 13], [56, 6], [56, 3], [56, 1], [56, 0]]
PROMPT_TINY = dict(
    eou=False,
    n_layers=2,
    d_model=64,
    n_heads=4,
    conv_channels=32,
    att_context_size=PROMPT_MODES,
    pred_hidden=48,
    pred_rnn_layers=2,
    joint_hidden=48,
    vocab=128,
    num_prompts=8,
    prompt_dictionary={"en-US": 0, "es-ES": 1, "de-DE": 2, "auto": 7},
    batch_mode=[56, 1],
)
PROMPT_FULL = dict(
    eou=False,
    n_layers=24,
    d_model=1024,
    n_heads=8,
    conv_channels=256,
    att_context_size=PROMPT_MODES,
    pred_hidden=640,
    pred_rnn_layers=2,
    joint_hidden=640,
    vocab=1024,  # BPE pieces; then the language tags and unused user-defined pieces up to `pieces`
    pieces=13087,  # the released tokenizer's size (blank excluded)
    num_prompts=128,
    prompt_dictionary={"en-US": 0, "en-GB": 1, "es-ES": 2, "de-DE": 3, "auto": 101},
)
TOKENIZER_PLACEHOLDER = "<TOKENIZER_DIR>"
BATCH_MODE = [70, 1]  # lookahead mode used for the three-streams-in-one-batch check
MAX_SYMBOLS = 10

log = logging.getLogger("make_nemo_fixtures")


def modes_of(spec):
    acs = spec["att_context_size"]
    return [list(acs)] if isinstance(acs[0], int) else [list(m) for m in acs]


def mode_key(mode):
    return f"{mode[0]},{mode[1]}"


def language_tags(spec) -> list[str]:
    """The language-tag pieces a prompt model writes (<en-US>, ...): one per language of its
    prompt dictionary (`auto` is a prompt, not a language)."""
    return [f"<{lang}>" for lang in spec.get("prompt_dictionary", {}) if lang != "auto"]


# ---------------------------------------------------------------------------------------------
# Audio
# ---------------------------------------------------------------------------------------------


def espeak(text: str) -> np.ndarray:
    """Speak `text` with espeak-ng; return float32 mono at 16 kHz."""
    import soundfile as sf
    from scipy.signal import resample_poly

    exe = shutil.which("espeak-ng")
    if exe is None:
        sys.exit("espeak-ng not found: apt-get install -y espeak-ng")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.wav")
        subprocess.run([exe, "-v", "en-us", "-s", "155", "-p", "50", "-a", "100", "-w", path, text], check=True)
        x, sr = sf.read(path, dtype="float64")
    if x.ndim > 1:
        x = x.mean(axis=1)
    if sr != SR:
        from math import gcd

        g = gcd(SR, sr)
        x = resample_poly(x, SR // g, sr // g)
    # trim espeak's leading/trailing digital silence to ~50 ms
    nz = np.nonzero(np.abs(x) > 1e-4)[0]
    pad = int(0.05 * SR)
    x = x[max(0, nz[0] - pad) : nz[-1] + pad]
    return x


def make_audio():
    import soundfile as sf

    AUDIO_DIR.mkdir(parents=True, exist_ok=True)
    lead = np.zeros(int(0.25 * SR))
    clips = {}
    s = espeak(SPEECH["sentence"][0])
    clips["sentence"] = np.concatenate([lead, s, lead])
    a, b = (espeak(t) for t in SPEECH["pause"])
    clips["pause"] = np.concatenate([lead, a, np.zeros(int(PAUSE_SECONDS * SR)), b, lead])
    n = espeak(SPEECH["noise"][0])
    n = np.concatenate([lead, n, lead])
    rng = np.random.default_rng(NOISE_SEED)
    speech_power = np.mean(n[np.abs(n) > 1e-4] ** 2)
    noise = rng.standard_normal(len(n)) * np.sqrt(speech_power / 10 ** (NOISE_SNR_DB / 10))
    clips["noise"] = n + noise
    info = {}
    for name, x in clips.items():
        x = x / max(1e-9, np.max(np.abs(x))) * 0.6  # peak -4.4 dBFS
        pcm = np.round(x * 32767).astype(np.int16)
        path = AUDIO_DIR / f"{name}.wav"
        sf.write(str(path), pcm, SR, subtype="PCM_16")
        info[name] = {
            "text": " ".join(SPEECH[name]),
            "sentences": SPEECH[name],
            "seconds": round(len(pcm) / SR, 3),
            "samples": int(len(pcm)),
        }
        assert path.stat().st_size < 300_000, (path, path.stat().st_size)
    info["_about"] = {
        "generator": "espeak-ng -v en-us -s 155 (resampled to 16 kHz, trimmed, peak 0.6)",
        "pause_seconds": PAUSE_SECONDS,
        "noise": f"white noise, {NOISE_SNR_DB} dB SNR over the speech samples, numpy default_rng({NOISE_SEED})",
        "espeak_version": subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout.strip(),
    }
    (AUDIO_DIR / "texts.json").write_text(json.dumps(info, indent=2) + "\n")
    log.info("audio: %s", {k: v["seconds"] for k, v in info.items() if not k.startswith("_")})


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------


def _normalize_lower(text: str) -> str:
    import re

    return re.sub(r"[^a-z' ]+", " ", text.lower()).strip()


def make_tokenizer(out_dir: Path, vocab_size: int, *, lowercase: bool, eou: bool, synthetic_words: int = 0,
                   extra: list[str] = ()):
    """Train a BPE sentencepiece tokenizer the way NeMo's create_spt_model does (same trainer
    flags, same tokenizer.model / tokenizer.vocab / vocab.txt files), except with the
    "identity" normaliser: NeMo's default nmt_nfkc embeds a 240 KB charsmap in tokenizer.model,
    and normalisation only matters for encoding text, never for ids -> pieces.

    EOU family: append <EOU>, <EOB> at the end as USER_DEFINED pieces (type 4, score 0), like
    NeMo's add_special_tokens_to_sentencepiece.py does for parakeet_realtime_eou_120m-v1
    (there: ids 1024, 1025 after 1024 normal pieces, blank = 1026).

    `extra`: more USER_DEFINED pieces appended the same way (the prompt family's language tags
    <en-US>, ...: single pieces the model writes, which NeMo's decoding turns into text and its
    strip_lang_tags removes again).
    """
    import sentencepiece as spm

    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    lines = [ln for ln in CORPUS.splitlines() if ln.strip()]
    if synthetic_words:
        # enough distinct material for a 1024-piece BPE (full-size key dumps only)
        rng = np.random.default_rng(7)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        for _ in range(synthetic_words // 10):
            words = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(10)]
            lines.append(" ".join(words))
    if lowercase:
        lines = [_normalize_lower(ln) for ln in lines]
    data = out_dir / "corpus.txt"
    data.write_text("\n".join(lines) + "\n")
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(1)
    spm.SentencePieceTrainer.Train(
        input=str(data),
        model_prefix=str(out_dir / "tokenizer"),
        vocab_size=vocab_size,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,
        model_type="bpe",
        character_coverage=1.0,
        bos_id=-1,
        eos_id=-1,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
    )
    data.unlink()
    appended = (["<EOU>", "<EOB>"] if eou else []) + list(extra)
    if appended:
        from sentencepiece import sentencepiece_model_pb2 as spt

        proto = spt.ModelProto()
        proto.ParseFromString((out_dir / "tokenizer.model").read_bytes())
        for tok in appended:
            proto.pieces.append(spt.ModelProto.SentencePiece(piece=tok, score=0.0, type=4))
        (out_dir / "tokenizer.model").write_bytes(proto.SerializeToString())
        with open(out_dir / "tokenizer.vocab", "a", encoding="utf8") as f:
            f.write("".join(f"{tok}\t0\n" for tok in appended))
    # vocab.txt as create_spt_model writes it (special pieces skipped, "##" for word-internal)
    vocab = []
    for line in (out_dir / "tokenizer.vocab").read_text(encoding="utf8").splitlines():
        piece = line.split("\t")[0]
        if piece in ("<s>", "</s>", "<pad>", "<unk>"):
            continue
        tok = piece[1:] if piece.startswith("\u2581") else f"##{piece}"
        vocab.append(tok if tok else piece[0])
    (out_dir / "vocab.txt").write_text("".join(v + "\n" for v in vocab), encoding="utf8")
    sp = spm.SentencePieceProcessor(model_file=str(out_dir / "tokenizer.model"))
    n = sp.get_piece_size()
    assert n == vocab_size + len(appended), n
    assert [sp.piece_to_id(tok) for tok in appended] == list(range(vocab_size, n))
    return out_dir


# ---------------------------------------------------------------------------------------------
# Model config (what NeMo's recipes / the released model_config.yaml hold)
# ---------------------------------------------------------------------------------------------


def model_config(spec: dict, tokenizer_dir: str) -> dict:
    cfg = {
        "sample_rate": SR,
        "compute_eval_loss": False,
        "log_prediction": False,
        "skip_nan_grad": False,
        "model_defaults": {
            "enc_hidden": spec["d_model"],
            "pred_hidden": spec["pred_hidden"],
            "joint_hidden": spec["joint_hidden"],
        },
        "train_ds": None,
        "validation_ds": None,
        "test_ds": None,
        "tokenizer": {"dir": tokenizer_dir, "type": "bpe"},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": SR,
            "normalize": "NA",
            "window_size": 0.025,
            "window_stride": 0.01,
            "window": "hann",
            "features": 128,
            "n_fft": 512,
            "frame_splicing": 1,
            "dither": 1.0e-05,
            "pad_to": 0,
        },
        "spec_augment": {
            "_target_": "nemo.collections.asr.modules.SpectrogramAugmentation",
            "freq_masks": 2,
            "time_masks": 10,
            "freq_width": 27,
            "time_width": 0.05,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": 128,
            "feat_out": -1,
            "n_layers": spec["n_layers"],
            "d_model": spec["d_model"],
            "use_bias": False,
            "subsampling": "dw_striding",
            "subsampling_factor": 8,
            "subsampling_conv_channels": spec["conv_channels"],
            "causal_downsampling": True,
            "ff_expansion_factor": 4,
            "self_attention_model": "rel_pos",
            "n_heads": spec["n_heads"],
            "att_context_size": copy.deepcopy(spec["att_context_size"]),
            "att_context_style": "chunked_limited",
            "att_context_probs": None,
            "xscaling": False,
            "untie_biases": True,
            "pos_emb_max_len": 5000,
            "conv_kernel_size": 9,
            "conv_norm_type": "layer_norm",
            "conv_context_size": "causal",
            "dropout": 0.1,
            "dropout_pre_encoder": 0.1,
            "dropout_emb": 0.0,
            "dropout_att": 0.1,
            "stochastic_depth_drop_prob": 0.0,
            "stochastic_depth_mode": "linear",
            "stochastic_depth_start_layer": 1,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None,
            "random_state_sampling": False,
            "blank_as_pad": True,
            "prednet": {
                "pred_hidden": spec["pred_hidden"],
                "pred_rnn_layers": spec["pred_rnn_layers"],
                "t_max": None,
                "dropout": 0.2,
            },
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None,
            "preserve_memory": False,
            "fuse_loss_wer": True,
            "fused_batch_size": 4,
            "jointnet": {"joint_hidden": spec["joint_hidden"], "activation": "relu", "dropout": 0.2},
        },
        # The inference settings of NeMo's cache-aware streaming example
        # (greedy_batch, max_symbols 10, preserve_alignments False, fused_batch_size -1) and
        # compute_timestamps False (see the reference doc: True crashes partial-hypothesis merging).
        "decoding": {
            "strategy": "greedy_batch",
            "greedy": {"max_symbols": MAX_SYMBOLS},
            "preserve_alignments": False,
            "compute_timestamps": False,
            "fused_batch_size": -1,
        },
        "loss": {"loss_name": "default", "warprnnt_numba_kwargs": {"fastemit_lambda": 0.005, "clamp": -1.0}},
        "optim": None,
    }
    if "prompt_dictionary" in spec:
        # EncDecRNNTBPEModelWithPrompt builds prompt_kernel only with initialize_prompt_feature
        cfg["model_defaults"].update(
            num_prompts=spec["num_prompts"],
            prompt_dictionary=dict(spec["prompt_dictionary"]),
            initialize_prompt_feature=True,
        )
    return cfg


def build_model(spec: dict, tokenizer_dir: Path, seed: int):
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from nemo.collections.asr.models.rnnt_bpe_models_prompt import EncDecRNNTBPEModelWithPrompt
    from omegaconf import OmegaConf, open_dict

    torch.manual_seed(seed)
    cfg = OmegaConf.create(model_config(spec, str(tokenizer_dir)))
    model = (EncDecRNNTBPEModelWithPrompt if "prompt_dictionary" in spec else EncDecRNNTBPEModel)(cfg=cfg)
    model.eval()
    with open_dict(model.cfg):
        # the files are registered as artifacts (tokenizer.model_path etc.); the temporary
        # training directory means nothing inside a .nemo
        model.cfg.tokenizer.dir = TOKENIZER_PLACEHOLDER
    return model


# ---------------------------------------------------------------------------------------------
# Weight shaping
# ---------------------------------------------------------------------------------------------


def perturb_defaults(model, seed: int):
    """NeMo initialises LayerNorms to (1, 0) and pos_bias_u/v to 0: randomise them so a
    re-implementation that forgets to load any of them fails the fixtures."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in model.encoder.named_modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.copy_(1.0 + 0.2 * torch.randn(mod.weight.shape, generator=g))
                mod.bias.copy_(0.1 * torch.randn(mod.bias.shape, generator=g))
        for name, p in model.encoder.named_parameters():
            if name.endswith("pos_bias_u") or name.endswith("pos_bias_v"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
        # (prediction net and joint are trained by shape_model); the blank row of the
        # prediction-net embedding must stay zero (blank_as_pad / padding_idx).
        emb = model.decoder.prediction["embed"]
        assert torch.all(emb.weight[model.decoder.blank_idx] == 0)


class Replay:
    """Plain frame-synchronous greedy RNN-T decode (at most MAX_SYMBOLS per frame, then the
    frame is left), used to enumerate every argmax decision and its margin. Its tokens are
    asserted equal to NeMo's greedy_batch (label-looping) output."""

    def __init__(self, model):
        self.m = model
        self.blank = model.decoder.blank_idx

    def pred_raw(self, label: int, state):
        import torch

        y = torch.tensor([[label]], dtype=torch.long)
        g, state = self.m.decoder.predict(y, state, add_sos=False, batch_size=1)
        return g[0, 0], state

    def decode(self, enc_t_d, length: int):
        """enc_t_d: [T, D] encoder output. Returns (tokens, margin per decision, max |logit|
        per decision)."""
        import torch

        j = self.m.joint
        with torch.no_grad():
            f = enc_t_d[:length]
            fp = j.project_encoder(f)
            g, state = self.pred_raw(self.blank, None)  # <SOS> = blank = zero embedding
            gp = j.project_prednet(g)
            tokens, margins, scale = [], [], []
            for t in range(length):
                for _ in range(MAX_SYMBOLS):
                    z = j.joint_net(fp[t] + gp)
                    top = torch.topk(z, 2)
                    y = int(top.indices[0])
                    margins.append(float(top.values[0] - top.values[1]))
                    scale.append(float(z.abs().max()))
                    if y == self.blank:
                        break
                    tokens.append(y)
                    g, state = self.pred_raw(y, state)
                    gp = j.project_prednet(g)
            return tokens, margins, scale


def offline_encode(model, audio: np.ndarray):
    """NeMo's offline path: preprocessor (eval: no dither) -> encoder (current default
    att_context_size, chunked_limited mask) on the whole utterance."""
    import torch

    with torch.no_grad():
        sig = torch.from_numpy(audio.astype(np.float32))[None]
        feats, flen = model.preprocessor(input_signal=sig, length=torch.tensor([sig.shape[1]]))
        enc, elen = model.encoder(audio_signal=feats, length=flen)
    return feats, flen, enc, elen


def frame_energy(features, n_frames: int, enc_frames: int):
    """Log mean mel energy of the mel frames encoder frame t is built from (causal subsampling:
    mel frames 8t-14 .. 8t), so every lookahead mode's encoder output can "see" it."""
    import torch

    f = features[:, :n_frames]
    e = torch.logsumexp(f, 0) - np.log(f.shape[0])
    out = []
    for t in range(enc_frames):
        lo, hi = max(0, 8 * t - 14), min(n_frames, 8 * t + 1)
        out.append(float(e[lo:hi].mean()) if hi > lo else float(e[-1]))
    return np.array(out)


class Policy:
    """The target greedy behaviour the tiny models are trained to show (a function of the
    encoder frame and the last emitted label only, so an RNN-T can represent it):

    - speech frame (energy above a per-wav threshold): emit token y1 = argmax of a fixed random
      projection of the (standardised) encoder frame over a few token rows and more "nothing"
      rows, unless y1 is one of the last two labels; on loud frames follow it with the
      second-best token y2 (two tokens in one frame happen). Token identities depend on the
      lookahead mode's encoder output, so the modes decode differently.
    - EOU family: the first silent frame after speech emits <EOU> once (then blank).
    - otherwise blank.
    """

    def __init__(self, d_model, n_normal, eou_id, seed, mu, sd, n_tokens=40, n_none=60):
        import torch

        self.mu, self.sd = mu, sd  # the projection sees standardised frames (diverse argmax)
        g = torch.Generator().manual_seed(seed)
        self.tokens = (torch.randperm(n_normal - 1, generator=g)[:n_tokens] + 1).tolist()  # never <unk>=0
        self.P = torch.randn(n_tokens + n_none, d_model, generator=g)
        self.n_tokens = n_tokens
        self.eou = eou_id
        self.ends = {eou_id}  # the labels end_label may give

    def end_label(self, f_row):
        """The label the first silent frame after speech emits (None: blank)."""
        return self.eou

    def labels(self, f_row, energy, th, recent):
        """Labels emitted at one frame given the last two labels before it (blank excluded)."""
        import torch

        last = recent[-1] if recent else None
        speech = energy > th[0]
        if not speech:
            end = self.end_label(f_row)
            if end is not None and last is not None and last not in self.ends:
                return [end]
            return []
        s = self.P @ ((f_row - self.mu) / self.sd)
        order = torch.argsort(s, descending=True).tolist()
        toks = [self.tokens[i] for i in order if i < self.n_tokens]
        if order[0] >= self.n_tokens:  # a "nothing" row won
            return []
        y1, y2 = toks[0], toks[1]
        if y1 in recent:
            return []
        return [y1, y2] if energy > th[1] and y2 not in recent else [y1]

    def path(self, enc_t_d, energies, th):
        """Target decisions [(t, u, label)] and emitted tokens for one utterance."""
        decisions, tokens = [], []
        for t in range(enc_t_d.shape[0]):
            for y in self.labels(enc_t_d[t], energies[t], th, tokens[-2:]):
                decisions.append((t, len(tokens), y))
                tokens.append(y)
            decisions.append((t, len(tokens), None))  # blank
        return decisions, tokens


class PromptPolicy(Policy):
    """`Policy` as one language prompt of a prompt model shapes it: the same frame projection and
    "nothing" rows for every prompt, but each prompt maps the rows to its own tokens (so a prompt
    visibly changes the transcript), and the first silent frame after speech emits the prompt's
    language tag once (`auto`: the tag a fixed random projection of that frame prefers, a
    stand-in for language identification), as the real model ends a sentence with <en-US>."""

    def __init__(self, base: Policy, tokens: list[int], tag: int | None, tags: list[int], Q):
        self.mu, self.sd, self.P, self.n_tokens = base.mu, base.sd, base.P, base.n_tokens
        self.tokens, self.tag, self.tags, self.Q = tokens, tag, tags, Q
        self.eou, self.ends = None, set(tags)

    def end_label(self, f_row):
        if self.tag is not None:
            return self.tag
        return self.tags[int((self.Q @ ((f_row - self.mu) / self.sd)).argmax())]

    @classmethod
    def per_prompt(cls, base: Policy, prompts: list[str], tag_ids: dict[str, int], n_normal: int, seed: int):
        """One policy per prompt; tag_ids: language -> id of its tag piece."""
        import torch

        g = torch.Generator().manual_seed(seed)
        tags = list(tag_ids.values())
        Q = torch.randn(len(tags), base.P.shape[1], generator=g)
        out = {}
        for p in prompts:
            tokens = (torch.randperm(n_normal - 1, generator=g)[: base.n_tokens] + 1).tolist()
            out[p] = cls(base, tokens, tag_ids.get(p), tags, Q)
        return out


def shape_model(model, name, spec, audios, info, *, seed, margin=1.0, target_rate=4.0):
    """Train the prediction net + joint (encoder untouched) so NeMo's greedy decode follows
    `Policy` with every argmax decision won by >= `margin` logits, over every utterance the
    fixtures decode (offline and full-buffer, every lookahead mode). Multi-class hinge loss on
    the teacher-forced target path; checked afterwards with `Replay` on the NeMo modules.

    A prompt model: the prompt kernel is trained too, and every utterance is decoded once per
    prompt of its dictionary, each following its own `PromptPolicy`; targets are then keyed
    (mode, wav, kind, prompt)."""
    import torch

    blank = model.decoder.blank_idx
    eou_id = blank - 2 if spec["eou"] else None
    n_normal = blank - 2 if spec["eou"] else blank
    prompts = list(spec.get("prompt_dictionary", {}))
    if prompts:
        n_normal = spec["vocab"]
        tag_ids = {t[1:-1]: model.tokenizer.token_to_id(t) for t in language_tags(spec)}
        assert sorted(tag_ids.values()) == list(range(n_normal, blank)), tag_ids
    modes = modes_of(spec)
    total_sec = sum(len(a) for a in audios.values()) / SR

    # utterances: offline (length = L // hop) and full buffer (all frames), per mode and wav
    runs = []
    thresholds = {}
    for mode in modes:
        set_mode(model, mode)
        for wav, audio in audios.items():
            feats, flen, enc, elen = offline_encode(model, audio)
            feats, flen = feats[0], int(flen[0])
            if wav not in thresholds:
                e = frame_energy(feats, flen, (flen + 7) // 8)
                lo, hi = np.percentile(e, 5), np.percentile(e, 90)
                thresholds[wav] = (lo + 0.35 * (hi - lo), hi - 0.1 * (hi - lo))
            with torch.no_grad():
                encb, elenb = model.encoder(audio_signal=feats[None], length=torch.tensor([feats.shape[-1]]))
            for kind, (e_, n_, nf) in {
                "offline": (enc, int(elen[0]), flen),
                "buffer": (encb, int(elenb[0]), feats.shape[-1]),
            }.items():
                f = e_[0, :, :n_].T.contiguous()
                for prompt in prompts or [None]:
                    runs.append(
                        dict(key=(mode_key(mode), wav, kind) + ((prompt,) if prompt else ()), f=f,
                             energy=frame_energy(feats, nf, n_), th=thresholds[wav], prompt=prompt)
                    )

    allf = torch.cat([r["f"] for r in runs])
    mu, sd = allf.mean(0), allf.std(0)

    def make_targets(n_none):
        pol = Policy(spec["d_model"], n_normal, eou_id, seed, mu, sd, n_none=n_none)
        per_prompt = PromptPolicy.per_prompt(pol, prompts, tag_ids, n_normal, seed + 1) if prompts else {}
        total = 0
        for r in runs:
            r["decisions"], r["tokens"] = per_prompt.get(r["prompt"], pol).path(r["f"], r["energy"], r["th"])
            if r["key"][2] == "offline":
                total += len(r["tokens"])
        return total / len(modes) / max(1, len(prompts)) / total_sec

    best = min((abs(make_targets(n) - target_rate), n) for n in (0, 5, 10, 20, 30, 40, 60, 80, 100, 130, 160))
    rate = make_targets(best[1])
    neou = sum(r["tokens"].count(eou_id) for r in runs if r["key"][2] == "offline") if eou_id is not None else 0
    log.info("%s: target path: %.2f tokens/s, %d <EOU> (offline, all modes)", name, rate, neou)
    if prompts:
        offline = [r for r in runs if r["key"][2] == "offline"]
        tags = {p: sum(t in tag_ids.values() for r in offline if r["prompt"] == p for t in r["tokens"]) for p in prompts}
        same = sum(a["tokens"] == b["tokens"] for a in offline for b in offline
                   if a["key"][:3] == b["key"][:3] and a["prompt"] < b["prompt"])
        log.info("%s: language tags per prompt (offline, all modes): %s; utterances decoded alike by two prompts: %d",
                 name, tags, same)
        assert same == 0, "every prompt must change the target path"
        info.update(target_tags_offline=tags)

    # teacher-forced batch
    U = max(len(r["tokens"]) for r in runs) + 1
    labels_in = torch.full((len(runs), U), blank, dtype=torch.long)
    for i, r in enumerate(runs):
        labels_in[i, 1 : len(r["tokens"]) + 1] = torch.tensor(r["tokens"], dtype=torch.long)
    R, Ui, Y, Fr = [], [], [], []
    for i, r in enumerate(runs):
        for t, u, y in r["decisions"]:
            R.append(i)
            Ui.append(u)
            Y.append(blank if y is None else y)
            Fr.append(r["f"][t])
    R, Ui, Y, Fr = torch.tensor(R), torch.tensor(Ui), torch.tensor(Y), torch.stack(Fr)
    params = [*model.decoder.parameters(), *model.joint.parameters()]
    if prompts:  # each decision's frame joined by the one-hot of its run's prompt, as NeMo joins them
        index = torch.tensor([spec["prompt_dictionary"][runs[i]["prompt"]] for i in R.tolist()])
        Fr = torch.cat([Fr, torch.nn.functional.one_hot(index, spec["num_prompts"]).to(Fr.dtype)], dim=1)
        params += [*model.prompt_kernel.parameters()]

    def joint_input(frames):
        return model.prompt_kernel(frames) if prompts else frames

    opt = torch.optim.Adam(params, lr=3e-3)
    model.eval()
    with torch.enable_grad():
        for step in range(10001):
            g, _ = model.decoder.predict(labels_in, None, add_sos=False, batch_size=len(runs))
            gp = model.joint.project_prednet(g)[R, Ui]
            z = model.joint.joint_net(model.joint.project_encoder(joint_input(Fr)) + gp)
            zy = z.gather(1, Y[:, None])
            gap = (zy - z).scatter(1, Y[:, None], float("inf"))
            # hinge + a little pull on the logits so they stay O(1-10)
            loss = torch.relu(1.5 * margin - gap).sum(1).mean() + 1e-3 * (z**2).mean()
            mm = float(gap.detach().min())
            if step % 250 == 0:
                log.info("  %s step %d: hinge %.4f, min margin %.4f, |z| max %.1f", name, step, float(loss), mm, float(z.abs().max()))
            if mm >= 1.2 * margin:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
    if mm < margin:
        with torch.no_grad():
            bad = torch.nonzero(gap.min(1).values < margin)[:, 0].tolist()
            for i in bad[:40]:
                r = runs[int(R[i])]
                log.warning("  bad decision: run %s t=%d u=%d label=%d argmax=%d gap=%.3f", r["key"], int((Fr[i, : r["f"].shape[1]] - r["f"]).abs().sum(1).argmin()), int(Ui[i]), int(Y[i]), int(z[i].argmax()), float(gap[i].min()))
        raise RuntimeError(f"{name}: margin training reached only {mm:.3f}; try another --seed")
    # the blank row of the prediction-net embedding must still be zero (padding_idx)
    assert torch.all(model.decoder.prediction["embed"].weight[blank] == 0)
    info.update(target_tokens_per_s=round(rate, 3), target_eou_offline=neou, trained_min_margin=mm, policy_none_rows=best[1])
    return {r["key"]: r["tokens"] for r in runs}


# ---------------------------------------------------------------------------------------------
# NeMo runs
# ---------------------------------------------------------------------------------------------


def _ids(hyp):
    import torch

    y = hyp.y_sequence
    if isinstance(y, torch.Tensor):
        y = y.tolist()
    return [int(v) for v in y]


def set_mode(model, mode):
    model.encoder.set_default_att_context_size(mode)
    model.encoder.setup_streaming_params()


def streaming_cfg_dict(model):
    c = model.encoder.streaming_cfg
    keys = [
        "chunk_size",
        "shift_size",
        "pre_encode_cache_size",
        "drop_extra_pre_encoded",
        "valid_out_len",
        "last_channel_cache_size",
        "cache_drop_size",
    ]
    out = {k: getattr(c, k) for k in keys}
    out["sampling_frames"] = model.encoder.pre_encode.get_sampling_frames()
    return {k: (list(v) if isinstance(v, (list, tuple)) else int(v)) for k, v in out.items()}


def is_prompt_model(model) -> bool:
    """EncDecRNNTBPEModelWithPrompt with its prompt kernel (initialize_prompt_feature)."""
    return bool(getattr(model, "concat", False))


def prompted(model, enc):
    """What the joint of a prompt model sees: NeMo's own projection (PromptStreamingMixin.
    _apply_prompt_to_encoded, the prompt set by set_inference_prompt) of encoder output
    [B, D, T]; other models: enc itself."""
    return model._apply_prompt_to_encoded(enc) if is_prompt_model(model) else enc


def run_streaming(model, wav_paths):
    """NeMo's cache-aware streaming, as examples/asr/asr_cache_aware_streaming/
    speech_to_text_cache_aware_streaming_infer.py runs it (pad_and_drop_preencoded=False,
    online_normalization=False). Several paths -> one batch. Returns per-stream results.

    A prompt model: `encoded` is what its joint sees (after the prompt projection that
    conformer_stream_step applies), `encoder_out` the encoder output before it."""
    import torch
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    buf = CacheAwareStreamingAudioBuffer(model=model, online_normalization=False, pad_and_drop_preencoded=False)
    for p in wav_paths:
        buf.append_audio_file(str(p), stream_id=-1)
    batch = len(wav_paths)
    features = buf.buffer.clone()  # [B, n_mels, T] what the buffer chunks (pre-encode cache included)
    lengths = buf.streams_length.clone()

    # capture the encoder output of every step (conformer_stream_step does not return it)
    captured = []
    orig = model.encoder.cache_aware_stream_step

    def spy(*a, **kw):
        r = orig(*a, **kw)
        captured.append((r[0].detach().clone(), r[1].detach().clone()))
        return r

    model.encoder.cache_aware_stream_step = spy
    raw = []
    if is_prompt_model(model):
        orig_prompt = model._apply_prompt_to_encoded

        def spy_prompt(enc):
            out = orig_prompt(enc)
            assert enc is captured[-1][0] or torch.equal(enc, captured[-1][0]), "prompt applied to another tensor"
            raw.append(captured[-1][0])
            captured[-1] = (out.detach().clone(), captured[-1][1])
            return out

        model._apply_prompt_to_encoded = spy_prompt
    try:
        cache_ch, cache_t, cache_len = model.encoder.get_initial_cache_state(batch_size=batch)
        prev_hyps, pred_out = None, None
        chunks = [[] for _ in range(batch)]
        seen = [0] * batch
        start = 0
        with torch.inference_mode():
            for step, (chunk, chunk_len) in enumerate(iter(buf)):
                drop = 0 if step == 0 else model.encoder.streaming_cfg.drop_extra_pre_encoded
                # the buffer has advanced buffer_idx by the shift before yielding this chunk
                step_start, start = start, int(buf.buffer_idx)
                (pred_out, texts, cache_ch, cache_t, cache_len, prev_hyps) = model.conformer_stream_step(
                    processed_signal=chunk,
                    processed_signal_length=chunk_len,
                    cache_last_channel=cache_ch,
                    cache_last_time=cache_t,
                    cache_last_channel_len=cache_len,
                    keep_all_outputs=buf.is_buffer_empty(),
                    previous_hypotheses=prev_hyps,
                    previous_pred_out=pred_out,
                    drop_extra_pre_encoded=drop,
                    return_transcription=True,
                )
                enc, enc_len = captured[-1]
                for b in range(batch):
                    ids = _ids(prev_hyps[b])
                    chunks[b].append(
                        {
                            "start_frame": step_start,
                            "new_frames": int(max(0, min(int(lengths[b]) - step_start, start - step_start))),
                            "in_frames": int(chunk.shape[-1]),
                            "in_length": int(chunk_len[b]),
                            "drop_extra_pre_encoded": int(drop),
                            "keep_all_outputs": bool(buf.is_buffer_empty()),
                            "enc_frames": int(enc_len[b]),
                            "new_tokens": ids[seen[b] :],
                        }
                    )
                    seen[b] = len(ids)
    finally:
        model.encoder.cache_aware_stream_step = orig
        if is_prompt_model(model):
            del model._apply_prompt_to_encoded  # the class's method again
            assert len(raw) == len(captured), "conformer_stream_step skipped the prompt"
    results = []
    for b in range(batch):
        enc_cat = torch.cat([e[b, :, : int(n[b])] for e, n in captured], dim=-1)
        results.append(
            {
                "tokens": _ids(prev_hyps[b]),
                "chunks": chunks[b],
                "encoded": enc_cat,  # [D, T'']
                "features": features[b, :, : int(lengths[b])],
            }
        )
        if raw:
            results[-1]["encoder_out"] = torch.cat([e[b, :, : int(n[b])] for e, (_, n) in zip(raw, captured)], dim=-1)
    return results


def run_offline(model, audio: np.ndarray):
    """Offline: the path model.forward()/transcribe() takes (preprocessor length = L // hop)."""
    import torch

    feats, flen, enc, elen = offline_encode(model, audio)
    with torch.no_grad():
        enc = prompted(model, enc)
        hyps = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=enc, encoded_lengths=elen, return_hypotheses=True
        )
    return {
        "tokens": _ids(hyps[0]),
        "encoded": enc[0, :, : int(elen[0])],
        "features": feats[0],
        "feature_length": int(flen[0]),
    }


def run_offline_buffer(model, features):
    """Offline as the streaming example's --compare_vs_offline does it: the whole streaming
    buffer (full preprocessor output, length = all frames) through conformer_stream_step
    without caches."""
    import torch

    with torch.inference_mode():
        x = features[None]
        n = torch.tensor([features.shape[-1]])
        enc, elen = model.encoder(audio_signal=x, length=n)
        enc = prompted(model, enc)
        hyps = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=enc, encoded_lengths=elen, return_hypotheses=True
        )
    return {"tokens": _ids(hyps[0]), "encoded": enc[0, :, : int(elen[0])]}


# ---------------------------------------------------------------------------------------------
# Reference runs on the saved + restored tiny models
# ---------------------------------------------------------------------------------------------


def apply_example_decoding(model):
    """What the streaming example does to the decoding config (plus compute_timestamps=False)."""
    from omegaconf import open_dict

    dec = model.cfg.decoding
    with open_dict(dec):
        dec.strategy = "greedy_batch"
        dec.preserve_alignments = False
        dec.fused_batch_size = -1
        if not (dec.greedy.get("max_symbols") or 0) > 0:
            dec.greedy.max_symbols = MAX_SYMBOLS
        dec.compute_timestamps = False
    model.change_decoding_strategy(dec)


def nemo_greedy(model, enc_d_t):
    import torch

    with torch.no_grad():
        hyps = model.decoding.rnnt_decoder_predictions_tensor(
            encoder_output=enc_d_t[None], encoded_lengths=torch.tensor([enc_d_t.shape[-1]]), return_hypotheses=True
        )
    return _ids(hyps[0])


def reference_runs(model, name, spec, audios, targets, tensors, shaping):
    import torch

    rp = Replay(model)
    blank = model.decoder.blank_idx
    modes = modes_of(spec)
    res = {
        "nemo_class": type(model).__module__ + "." + type(model).__name__,
        "modes": [list(m) for m in modes],
        "default_mode": list(modes[0]),
        "vocab_size": int(model.tokenizer.vocab_size),
        "blank_id": int(blank),
        "eou_id": int(model.tokenizer.token_to_id("<EOU>")) if spec["eou"] else None,
        "eob_id": int(model.tokenizer.token_to_id("<EOB>")) if spec["eou"] else None,
        "structure": {k: spec[k] for k in spec if k not in ("vocab",)},
        "param_count": int(sum(p.numel() for p in model.parameters())),
        "streaming_cfg": {},
        "runs": {},
    }
    margins_all, scale_all = [], []

    def check(kind, enc, nemo_tokens, where):
        toks, margins, scale = rp.decode(enc.T.contiguous(), enc.shape[-1])
        if toks != nemo_tokens:
            raise AssertionError(f"{name} {where} {kind}: replay {toks} != NeMo {nemo_tokens}")
        margins_all.extend(margins)
        scale_all.extend(scale)
        return min(margins) if margins else None

    for mode in modes:
        set_mode(model, mode)
        mk = mode_key(mode)
        res["streaming_cfg"][mk] = streaming_cfg_dict(model)
        for wav in WAV_NAMES:
            s = run_streaming(model, [AUDIO_DIR / f"{wav}.wav"])[0]
            o = run_offline(model, audios[wav])
            ob = run_offline_buffer(model, s["features"])
            assert torch.equal(s["features"], o["features"]), "buffer features != model.preprocessor features"
            where = f"{wav} {mk}"
            m = {
                "stream": check("stream", s["encoded"], s["tokens"], where),
                "offline": check("offline", o["encoded"], o["tokens"], where),
                "offline_buffer": check("offline_buffer", ob["encoded"], ob["tokens"], where),
            }
            assert o["tokens"] == targets[(mk, wav, "offline")], (name, where, "offline vs target")
            assert ob["tokens"] == targets[(mk, wav, "buffer")], (name, where, "buffer vs target")
            n_stream = s["encoded"].shape[-1]
            n_common = min(n_stream, o["encoded"].shape[-1])
            prefix_tokens = nemo_greedy(model, o["encoded"][:, :n_stream])
            diff = (s["encoded"][:, :n_common] - o["encoded"][:, :n_common]).abs().amax(0)
            diff_b = (s["encoded"] - ob["encoded"][:, :n_stream]).abs().amax()
            starts = [c["start_frame"] for c in s["chunks"]]
            res["runs"].setdefault(wav, {})[mk] = {
                "stream_tokens": s["tokens"],
                "chunks": s["chunks"],
                "stream_enc_frames": int(n_stream),
                "mel_frames": int(s["features"].shape[-1]),
                "mel_frames_streamed": int(s["chunks"][-1]["start_frame"] + s["chunks"][-1]["new_frames"]),
                "offline_tokens": o["tokens"],
                "offline_enc_frames": int(o["encoded"].shape[-1]),
                "offline_feature_length": o["feature_length"],
                "offline_prefix_tokens": prefix_tokens,
                "offline_buffer_tokens": ob["tokens"],
                "offline_buffer_enc_frames": int(ob["encoded"].shape[-1]),
                "stream_equals_offline": s["tokens"] == o["tokens"],
                "stream_equals_offline_prefix": s["tokens"] == prefix_tokens,
                "stream_equals_offline_buffer": s["tokens"] == ob["tokens"],
                "stream_vs_offline_max_abs_diff_common_frames": float(diff.max()),
                "stream_vs_offline_frames_over_1e-4": [int(i) for i in torch.nonzero(diff > 1e-4)[:, 0]],
                "stream_vs_offline_buffer_max_abs_diff": float(diff_b),
                "min_margin": {k: v for k, v in m.items()},
                "chunk_starts": starts,
            }
            # both tiny models share the preprocessor config: features are stored once per wav
            fkey = f"features/{wav}"
            if fkey in tensors:
                assert torch.equal(tensors[fkey], s["features"]), "preprocessor output differs between models"
            tensors[fkey] = s["features"].contiguous()
            tensors[f"{name}/{wav}/{mk}/offline_encoded"] = o["encoded"].contiguous()
            tensors[f"{name}/{wav}/{mk}/stream_encoded"] = s["encoded"].contiguous()
            if "encoder_out" in s:  # a prompt model (name = model/prompt): the encoder output before the prompt
                key = f"{name.split('/')[0]}/{wav}/{mk}/stream_encoder_out"
                assert key not in tensors or torch.equal(tensors[key], s["encoder_out"]), "encoder output depends on the prompt"
                tensors[key] = s["encoder_out"].contiguous()
            log.info(
                "%s %s %s: stream %d tok / offline %d tok (stream==offline %s, ==prefix %s), min margin %.3f",
                name, wav, mk, len(s["tokens"]), len(o["tokens"]), s["tokens"] == o["tokens"],
                s["tokens"] == prefix_tokens, min(v for v in m.values() if v is not None),
            )

    # three streams in one batch
    batch_mode = spec.get("batch_mode", BATCH_MODE)
    set_mode(model, batch_mode)
    mk = mode_key(batch_mode)
    batch = run_streaming(model, [AUDIO_DIR / f"{w}.wav" for w in WAV_NAMES])
    bres = {"mode": list(batch_mode), "order": WAV_NAMES, "streams": {}}
    for wav, b in zip(WAV_NAMES, batch):
        solo = res["runs"][wav][mk]
        mb = check("batch", b["encoded"], b["tokens"], f"batch {wav}")
        bres["streams"][wav] = {
            "tokens": b["tokens"],
            "chunks": b["chunks"],
            "enc_frames": int(b["encoded"].shape[-1]),
            "equals_solo_stream": b["tokens"] == solo["stream_tokens"],
            "equals_offline_buffer": b["tokens"] == solo["offline_buffer_tokens"],
            "equals_offline": b["tokens"] == solo["offline_tokens"],
            "min_margin": mb,
        }
        tensors[f"{name}/batch/{wav}/stream_encoded"] = b["encoded"].contiguous()
        log.info("%s batch %s: %d tok, equals solo stream: %s", name, wav, len(b["tokens"]), b["tokens"] == solo["stream_tokens"])
    res["batch"] = bres
    res["min_margin"] = float(min(margins_all))
    res["decisions_checked"] = len(margins_all)
    res["logit_abs_max"] = {
        "median": float(np.median(scale_all)),
        "p95": float(np.percentile(scale_all, 95)),
        "max": float(np.max(scale_all)),
    }
    res["shaping"] = shaping
    set_mode(model, modes[0])
    return res


# ---------------------------------------------------------------------------------------------
# Full-size configs: state_dict keys and model_config.yaml (random init, no download)
# ---------------------------------------------------------------------------------------------

def config_yaml_for(model) -> str:
    """model_config.yaml as NeMo's save_to writes it, tokenizer paths replaced by a placeholder."""
    import nemo
    from omegaconf import OmegaConf, open_dict

    cfg = copy.deepcopy(model.cfg)
    with open_dict(cfg):
        tok = cfg.tokenizer
        tok.dir = TOKENIZER_PLACEHOLDER
        # save_to registers the tokenizer files as archive members "nemo:<uuid>_<name>"
        for key, fname in (("model_path", "tokenizer.model"), ("vocab_path", "vocab.txt"), ("spe_tokenizer_vocab", "tokenizer.vocab")):
            tok[key] = f"nemo:<uuid>_{fname}"
        cfg.target = f"{type(model).__module__}.{type(model).__name__}"
        cfg.nemo_version = nemo.__version__
    return OmegaConf.to_yaml(cfg)


def full_size_dump(tmp: Path, seed: int, specs: dict = FULL):
    """The full-size models' state_dict shapes (full_size_keys.json) and model_config.yaml; with
    `specs` other than FULL, their entries are added to (or replace theirs in) the existing file."""
    import gc

    keys = NEMO_DIR / "full_size_keys.json"
    out = json.loads(keys.read_text()) if specs is not FULL and keys.exists() else {}
    for size, spec in specs.items():
        extra = language_tags(spec)
        extra += [f"<unused{i}>" for i in range(spec.get("pieces", 0) - spec["vocab"] - len(extra))]
        tdir = make_tokenizer(
            tmp / f"tok_{size}", spec["vocab"], lowercase=spec["eou"], eou=spec["eou"], synthetic_words=60000,
            extra=extra,
        )
        model = build_model(spec, tdir, seed)
        sd = model.state_dict()
        groups = {}
        for n, p in model.named_parameters():
            top = n.split(".")[0]
            groups[top] = groups.get(top, 0) + p.numel()
        out[size] = {
            "param_count": int(sum(p.numel() for p in model.parameters())),
            "param_count_by_module": {k: int(v) for k, v in groups.items()},
            "vocab_size": int(model.tokenizer.vocab_size),
            "blank_id": int(model.decoder.blank_idx),
            "structure": {k: spec[k] for k in spec},
            "state_dict": {k: list(v.shape) for k, v in sd.items()},
            "state_dict_dtypes": sorted({str(v.dtype) for v in sd.values()}),
        }
        (NEMO_DIR / f"{size}_model_config.yaml").write_text(config_yaml_for(model))
        log.info("%s: %d parameters (%s), %d state_dict entries", size, out[size]["param_count"], out[size]["param_count_by_module"], len(sd))
        del model, sd
        gc.collect()
    keys.write_text(json.dumps(out, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-full-size", action="store_true", help="do not rebuild the full-size key dumps")
    ap.add_argument("--only-full-size", action="store_true", help="only rebuild the full-size key dumps")
    ap.add_argument("--family", choices=["all", "prompt_tiny"], default="all",
                    help="prompt_tiny: only the prompt family (its own files, the committed wavs; the others stay as they are)")
    args = ap.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch
    from nemo.utils import logging as nemo_logging

    nemo_logging.setLevel(logging.ERROR)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    NEMO_DIR.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if not args.only_full_size:
            if args.family == "all":
                make_tiny(tmp, args.seed)
            make_prompt_tiny(tmp, args.seed)
        if not args.skip_full_size:
            if args.family == "all":
                full_size_dump(tmp, args.seed)
            full_size_dump(tmp, args.seed, {"multilingual": PROMPT_FULL})
    sizes = {p.name: p.stat().st_size for p in sorted([*AUDIO_DIR.iterdir(), *NEMO_DIR.iterdir()])}
    log.info("fixture sizes: %s (total %.2f MB)", sizes, sum(sizes.values()) / 1e6)


def make_tiny(tmp: Path, seed: int):
    import sentencepiece
    import soundfile as sf
    import torch
    from nemo.collections.asr.models import ASRModel
    from safetensors.torch import save_file

    import nemo

    make_audio()
    audios = {w: sf.read(str(AUDIO_DIR / f"{w}.wav"), dtype="float32")[0] for w in WAV_NAMES}
    ref = {
        "generated_by": "scripts/make_nemo_fixtures.py",
        "nemo_version": nemo.__version__,
        "torch_version": torch.__version__,
        "sentencepiece_version": sentencepiece.__version__,
        "seed": seed,
        "max_symbols": MAX_SYMBOLS,
        "wavs": WAV_NAMES,
        "notes": REFERENCE_NOTES,
        "models": {},
    }
    tensors = {}
    for k, (name, spec) in enumerate(TINY.items()):
        tdir = make_tokenizer(tmp / f"tok_{name}", spec["vocab"], lowercase=spec["eou"], eou=spec["eou"])
        model = build_model(spec, tdir, seed + 101 * k)
        perturb_defaults(model, seed + 101 * k + 1)
        shaping = {}
        targets = shape_model(model, name, spec, audios, shaping, seed=seed + 101 * k + 2)
        set_mode(model, modes_of(spec)[0])
        path = NEMO_DIR / f"{name}.nemo"
        model.save_to(str(path))
        del model
        # everything recorded comes from the restored archive: exactly what the tests load
        model = ASRModel.restore_from(str(path), map_location="cpu")
        model.eval()
        apply_example_decoding(model)
        ref["models"][name] = reference_runs(model, name, spec, audios, targets, tensors, shaping)
        ref["models"][name]["nemo_file"] = path.name
    mins = {n: m["min_margin"] for n, m in ref["models"].items()}
    ref["min_margin_overall"] = min(mins.values())
    (NEMO_DIR / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    save_file(tensors, str(NEMO_DIR / "reference.safetensors"), metadata={"nemo_version": nemo.__version__})
    log.info("smallest margin: %s", mins)


def make_prompt_tiny(tmp: Path, seed: int):
    """The prompt family's tiny model (prompt_tiny.nemo) and NeMo's reference runs of it, once per
    prompt of its dictionary (set_inference_prompt on the restored archive), with the text NeMo's
    decoding writes for every streaming run, language tags kept and stripped
    (prompt_reference.json / .safetensors). Reads the committed wavs (make_tiny writes them)."""
    import sentencepiece
    import soundfile as sf
    import torch
    from nemo.collections.asr.models import ASRModel
    from safetensors.torch import load_file, save_file

    import nemo

    name, spec = "prompt_tiny", PROMPT_TINY
    audios = {w: sf.read(str(AUDIO_DIR / f"{w}.wav"), dtype="float32")[0] for w in WAV_NAMES}
    k = len(TINY)  # seeds follow the families before it
    tdir = make_tokenizer(tmp / f"tok_{name}", spec["vocab"], lowercase=False, eou=False, extra=language_tags(spec))
    model = build_model(spec, tdir, seed + 101 * k)
    perturb_defaults(model, seed + 101 * k + 1)
    shaping = {}
    targets = shape_model(model, name, spec, audios, shaping, seed=seed + 101 * k + 2)
    set_mode(model, modes_of(spec)[0])
    path = NEMO_DIR / f"{name}.nemo"
    model.save_to(str(path))
    del model
    # The archive's target is EncDecRNNTBPEModelWithPrompt, and restoring it (ASRModel or the
    # class's own restore_from, which goes through EncDecRNNTBPEModel) builds that class again,
    # prompt kernel included: checked, so no reference below is an unprompted one.
    model = ASRModel.restore_from(str(path), map_location="cpu")
    assert type(model).__name__ == "EncDecRNNTBPEModelWithPrompt" and is_prompt_model(model), type(model)
    model.eval()
    apply_example_decoding(model)

    tensors, prompts = {}, {}
    for prompt in spec["prompt_dictionary"]:
        model.set_inference_prompt(prompt)
        mine = {key[:3]: tokens for key, tokens in targets.items() if key[3] == prompt}
        res = reference_runs(model, f"{name}/{prompt}", spec, audios, mine, tensors, shaping)
        for by_mode in res["runs"].values():
            for run in by_mode.values():
                run["tokenizer_text"], run["text"], run["text_stripped"] = nemo_texts(model, run["stream_tokens"])
        prompts[prompt] = {key: res.pop(key) for key in ("runs", "batch", "min_margin", "decisions_checked", "logit_abs_max")}
        res.pop("shaping")
        common = res  # the model's facts, the same for every prompt
    for prompt, p in prompts.items():
        for wav, by_mode in p["runs"].items():
            for mk, run in by_mode.items():
                others = [q["runs"][wav][mk]["stream_tokens"] for o, q in prompts.items() if o != prompt]
                assert run["stream_tokens"] not in others, f"{prompt} {wav} {mk}: another prompt decodes the same"
    # the features are the committed ones (reference.safetensors), not stored twice; equal up to
    # float noise (another machine's STFT differs by ~1e-4 on log-mel values of ~10)
    committed = load_file(str(NEMO_DIR / "reference.safetensors"))
    for key in [key for key in tensors if key.startswith("features/")]:
        diff = float((tensors.pop(key) - committed[key]).abs().max())
        assert diff < 1e-3, f"{key} differs from reference.safetensors by {diff}"
        shaping.setdefault("features_vs_reference_max_abs_diff", {})[key] = diff
    ref = {
        "generated_by": "scripts/make_nemo_fixtures.py --family prompt_tiny",
        "nemo_version": nemo.__version__,
        "torch_version": torch.__version__,
        "sentencepiece_version": sentencepiece.__version__,
        "seed": seed,
        "max_symbols": MAX_SYMBOLS,
        "wavs": WAV_NAMES,
        "notes": {**REFERENCE_NOTES, **PROMPT_NOTES},
        "models": {
            name: {
                **common,
                "nemo_file": path.name,
                "num_prompts": int(model.num_prompts),
                "prompt_dictionary": dict(model.cfg.model_defaults.prompt_dictionary),
                "language_tags": {t: int(model.tokenizer.token_to_id(t)) for t in language_tags(spec)},
                "lang_tag_pattern": lang_tag_pattern(model),
                "prompts": prompts,
                "min_margin": min(p["min_margin"] for p in prompts.values()),
                "shaping": shaping,
            }
        },
    }
    ref["min_margin_overall"] = ref["models"][name]["min_margin"]
    (NEMO_DIR / "prompt_reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    save_file(tensors, str(NEMO_DIR / "prompt_reference.safetensors"), metadata={"nemo_version": nemo.__version__})
    log.info("%s: smallest margin %s", name, {p: v["min_margin"] for p, v in prompts.items()})


def nemo_texts(model, tokens: list[int]) -> tuple[str, str, str]:
    """NeMo's texts of `tokens`: its tokenizer's (ids_to_text: tags written as they are), its
    decoding's (Hypothesis.text: also no space before punctuation), and the decoding's with
    strip_lang_tags on (NeMo's default pattern)."""
    dec = model.decoding
    text = dec.decode_tokens_to_str_with_strip_punctuation(tokens)
    dec.set_strip_lang_tags(True)
    try:
        return model.tokenizer.ids_to_text(tokens), text, dec.decode_tokens_to_str_with_strip_punctuation(tokens)
    finally:
        dec.set_strip_lang_tags(False)


def lang_tag_pattern(model) -> str:
    """NeMo's default strip_lang_tags regex."""
    dec = model.decoding
    dec.set_strip_lang_tags(True)
    try:
        return dec.lang_tag_pattern.pattern
    finally:
        dec.set_strip_lang_tags(False)


PROMPT_NOTES = {
    "prompts": "one entry per prompt of the model's prompt_dictionary: NeMo's runs after model.set_inference_prompt(prompt) (without it conformer_stream_step skips the prompt projection)",
    "encoded": "prompt_reference.safetensors prompt_tiny/<prompt>/<wav>/<mode>/{offline,stream}_encoded: what the joint sees, [d_model, T'] after the prompt projection; prompt_tiny/<wav>/<mode>/stream_encoder_out: the encoder output before it (the same for every prompt)",
    "tokenizer_text": "NeMo's tokenizer.ids_to_text(stream_tokens): sentencepiece's text, language tags written as they are",
    "text": "NeMo's Hypothesis.text for stream_tokens (decode_tokens_to_str_with_strip_punctuation: no space before a punctuation mark), language tags kept (strip_lang_tags False, the default)",
    "text_stripped": "the same with decoding strip_lang_tags True (lang_tag_pattern: NeMo's default regex)",
    "language_tags": "the tag pieces (user-defined sentencepiece pieces appended after the BPE pieces) -> token id",
    "features": "reference.safetensors features/<wav> (asserted identical when this file was made)",
}


REFERENCE_NOTES = {
    "tokens": "greedy token ids, blank excluded, special tokens (<EOU>) included",
    "stream_tokens": "NeMo CacheAwareStreamingAudioBuffer(online_normalization=False, pad_and_drop_preencoded=False) + conformer_stream_step, as examples/asr/asr_cache_aware_streaming/speech_to_text_cache_aware_streaming_infer.py",
    "chunks": "per streaming step: start_frame (mel frame where the step's new frames start), in_frames (frames fed incl. pre-encode cache), in_length (valid frames, per stream), new_frames, drop_extra_pre_encoded, keep_all_outputs, enc_frames (encoder frames out), new_tokens",
    "offline_tokens": "model.preprocessor (length = samples // 160) -> model.encoder (default att_context_size = the mode) -> greedy_batch decode",
    "offline_buffer_tokens": "the example's --compare_vs_offline: the whole streaming buffer (all preprocessor frames, incl. the last masked zero frame) through the encoder without caches",
    "offline_prefix_tokens": "offline encoder output cut to the frames streaming produced, greedy decoded",
    "min_margin": "smallest (top1 - top2) logit gap over every greedy argmax decision (checked with a plain frame-loop greedy decoder that reproduces NeMo's tokens exactly)",
    "features": "reference.safetensors features/<wav>: preprocessor output [n_mels, T] for the whole wav (eval: no dither), identical for both tiny models (same preprocessor config); T = samples // 160 + 1 and the last frame is masked to 0 (valid length samples // 160); this full tensor is what CacheAwareStreamingAudioBuffer chunks",
    "encoded": "reference.safetensors <model>/<wav>/<mode>/{offline,stream}_encoded: encoder output [d_model, T'] (stream: the per-chunk outputs concatenated)",
}


if __name__ == "__main__":
    main()

"""Offline English speech synthesizers used to build the demo corpus (demo_model/data.py).

A voice is ``(synth, voice, variant)``:

* ``espeak`` -- espeak-ng accents (``voice``) x voice variants (``variant``); rate in
  words per minute (``speed``), pitch 0-99 (``pitch``).  Output 22.05 kHz.
* ``flite`` -- flite's built-in voices (``flite -lv``): kal (8 kHz diphone), kal16
  (16 kHz diphone), awb, slt, rms (clustergen).  Rate via ``duration_stretch``, pitch
  via ``int_f0_target_mean`` (ignored by rms: its pitch is fixed).  ``awb_time`` is a
  limited-domain voice (it only says times) and is not used.
* ``festival`` -- the installed English festival voices via ``text2wave -eval
  '(voice_xxx)'``: kal_diphone, ked_diphone (Debian festvox-kallpc16k,
  festvox-kdlpc16k) and cmu_us_slt_arctic_hts (festvox-us-slt-hts, 32 kHz).  Rate via
  ``(Parameter.set 'Duration_Stretch ...)`` for the diphone voices and the HTS engine's
  ``-r`` speed for the HTS voice; pitch via ``int_lr_params`` target_f0_mean (diphone
  voices; the HTS voice's pitch is fixed).  ``festvox-k?lpc8k`` are 8 kHz copies of the
  same two speakers and add nothing the telephone augmentation does not.

Every function returns ``(float32 samples in [-1, 1], sample rate)``; the caller
resamples.  Nothing here is random: the plan (demo_model/data.py) draws the values.
"""

from __future__ import annotations

import os
import subprocess
import tempfile

import numpy as np

SYNTHS = ("espeak", "flite", "festival")

# Voices per synthesizer: (train voices, held-out voices).  A held-out voice never
# renders a train or test_sentences utterance.  Where two engines share a speaker
# (kal, slt), the speaker is in train for both; the held-out speakers (rms, ked) are
# held out of every engine.
FLITE_VOICES = (["kal", "kal16", "awb", "slt"], ["rms"])
FESTIVAL_VOICES = (["kal_diphone", "cmu_us_slt_arctic_hts"], ["ked_diphone"])

# Mean F0 range (Hz) drawn per utterance, by speaker sex; None: pitch not controllable.
MALE_F0 = (85, 140)
FEMALE_F0 = (145, 220)
VOICE_F0 = {
    ("flite", "kal"): MALE_F0, ("flite", "kal16"): MALE_F0, ("flite", "awb"): MALE_F0,
    ("flite", "slt"): FEMALE_F0, ("flite", "rms"): None,
    ("festival", "kal_diphone"): MALE_F0, ("festival", "ked_diphone"): MALE_F0,
    ("festival", "cmu_us_slt_arctic_hts"): None,
}
STRETCH_RANGE = (0.8, 1.3)  # duration factor (> 1: slower) for flite and festival

ESPEAK_RATE = 22050
PACKAGES = {"espeak": "espeak-ng", "flite": "flite",
            "festival": "festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"}
BINARIES = {"espeak": "espeak-ng", "flite": "flite", "festival": "text2wave"}


def synth_voices(synth: str) -> tuple[list[str], list[str]]:
    """(train voices, held-out voices) of a non-espeak synthesizer."""
    return {"flite": FLITE_VOICES, "festival": FESTIVAL_VOICES}[synth]


def parse_wav(data: bytes, what: str) -> tuple[np.ndarray, int]:
    """16-bit mono PCM WAV bytes -> (float32 samples, rate); tolerates bogus chunk sizes."""
    k = data.find(b"data")
    if data[:4] != b"RIFF" or k < 0:
        raise RuntimeError(f"{what} gave no WAV")
    channels = int.from_bytes(data[22:24], "little")
    bits = int.from_bytes(data[34:36], "little")
    if channels != 1 or bits != 16:
        raise RuntimeError(f"{what}: expected 16-bit mono, got {bits}-bit x{channels}")
    rate = int.from_bytes(data[24:28], "little")
    pcm = data[k + 8:]
    pcm = pcm[: len(pcm) // 2 * 2]
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0, rate


def espeak(text: str, accent: str, variant: str, speed: int, pitch: int,
           markup: bool = False) -> tuple[np.ndarray, int]:
    """``markup``: the text is SSML (e.g. ``<speak>... <break time="500ms"/> ...</speak>``)."""
    voice = accent if variant == "default" else f"{accent}+{variant}"
    out = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), *(["-m"] if markup else []),
                          "--stdout", text], capture_output=True, check=True).stdout
    x, rate = parse_wav(out, f"espeak-ng {voice!r}")  # streaming header: sizes are bogus
    if rate != ESPEAK_RATE:
        raise RuntimeError(f"unexpected espeak rate {rate}")
    return x, rate


def flite(text: str, voice: str, stretch: float, f0_hz: float | None) -> tuple[np.ndarray, int]:
    cmd = ["flite", "-voice", voice, "--setf", f"duration_stretch={stretch}"]
    if f0_hz is not None:
        cmd += ["--setf", f"int_f0_target_mean={f0_hz}"]
    with tempfile.TemporaryDirectory(prefix="flite") as d:
        wav = os.path.join(d, "out.wav")
        subprocess.run(cmd + ["-t", text, "-o", wav], capture_output=True, check=True)
        with open(wav, "rb") as f:
            return parse_wav(f.read(), f"flite {voice!r}")


def festival_setup(voice: str, stretch: float, f0_hz: float | None) -> list[str]:
    """The Scheme expressions that select and adjust a festival voice."""
    exprs = [f"(voice_{voice})"]
    if voice.endswith("_hts"):  # HTS ignores Duration_Stretch; its -r is a speed (> 1: faster)
        exprs.append(f"(set! hts_engine_params (append hts_engine_params '((\"-r\" {1 / stretch:.4f}))))")
    else:
        exprs.append(f"(Parameter.set 'Duration_Stretch {stretch})")
    if f0_hz is not None:
        exprs.append(f"(set! int_lr_params '((target_f0_mean {f0_hz}) (target_f0_std {f0_hz * 0.14:.1f}) "
                     "(model_f0_mean 170) (model_f0_std 34)))")
    return exprs


def festival(text: str, voice: str, stretch: float, f0_hz: float | None) -> tuple[np.ndarray, int]:
    cmd = ["text2wave"]
    for e in festival_setup(voice, stretch, f0_hz):
        cmd += ["-eval", e]
    out = subprocess.run(cmd + ["-o", "-"], input=(text + "\n").encode(),
                         capture_output=True, check=True).stdout
    return parse_wav(out, f"festival {voice!r}")


def synthesize(it: dict) -> tuple[np.ndarray, int]:
    """Render one plan item (``synth`` missing means espeak, as in plans made before synths)."""
    synth = it.get("synth", "espeak")
    if synth == "espeak":
        return espeak(it["text"], it["voice"], it["variant"], it["speed"], it["pitch"])
    if synth == "flite":
        return flite(it["text"], it["voice"], it["stretch"], it["f0_hz"])
    if synth == "festival":
        return festival(it["text"], it["voice"], it["stretch"], it["f0_hz"])
    raise ValueError(f"unknown synthesizer {synth!r}")

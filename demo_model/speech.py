"""Speech made with espeak-ng as the demo corpus makes it, for the tests, evaluations, benchmarks and
the README's screenshot: the held-out demo sentences (tests/fixtures/demo_sentences.json) rendered
one by one, and the live-captions page's sentence as a 48 kHz WAV. Needs espeak-ng."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "demo_sentences.json"
ESPEAK_RATE, RATE = 22050, 16000

PAGE_SENTENCE = "at the end of the day he went home"  # what the page's fake microphone says
PAGE_WAV_RATE = 48000
PAGE_LEAD_SECONDS, PAGE_TAIL_SECONDS = 0.5, 1.0


def synth(item: dict, seed: int, lead: float = 0.2, tail: float = 0.15) -> np.ndarray:
    """espeak-ng rendering as in demo_model/data.py: 22.05 kHz -> 16 kHz, lead/tail silence,
    light white noise (SNR 35 dB), peak at -6 dBFS, 16-bit rounding."""
    import soxr

    voice = item["voice"] if item["variant"] == "default" else f"{item['voice']}+{item['variant']}"
    markup = ["-m"] if item["text"].startswith("<speak>") else []  # SSML, e.g. a <break time="500ms"/>
    out = subprocess.run(["espeak-ng", "-v", voice, "-s", str(item["speed"]), "-p", str(item["pitch"]), *markup,
                          "--stdout", item["text"]], capture_output=True, check=True).stdout
    k = out.find(b"data")
    assert out[:4] == b"RIFF" and k > 0, "espeak-ng gave no WAV"
    assert int.from_bytes(out[24:28], "little") == ESPEAK_RATE
    pcm = out[k + 8:]
    x = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0
    y = soxr.resample(x, ESPEAK_RATE, RATE, quality="HQ").astype(np.float64)
    rng = np.random.default_rng(seed)
    speech = y[np.abs(y) > 0.01]
    power = float(np.mean(speech**2)) if speech.size else 1e-6
    y = np.concatenate([np.zeros(int(lead * RATE)), y, np.zeros(int(tail * RATE))])
    y = y + rng.standard_normal(len(y)) * math.sqrt(power / 10 ** 3.5)
    y = y * (10 ** (-6 / 20) / max(np.abs(y).max(), 1e-9))
    return (np.round(y * 32767) / 32768).astype(np.float32)


def page_speech_wav(path: Path) -> Path:
    """The page's sentence by espeak-ng, peak -6 dBFS, with silence around it, as 48 kHz PCM16."""
    import soundfile as sf
    import soxr

    raw = path.with_suffix(".espeak.wav")
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-w", str(raw), PAGE_SENTENCE], check=True)
    voice, rate = sf.read(raw, dtype="float32")
    voice = soxr.resample(voice, rate, PAGE_WAV_RATE).astype(np.float32)
    voice *= 0.5 / max(1e-6, float(np.abs(voice).max()))
    silence = lambda seconds: np.zeros(int(seconds * PAGE_WAV_RATE), np.float32)
    sf.write(path, np.concatenate([silence(PAGE_LEAD_SECONDS), voice, silence(PAGE_TAIL_SECONDS)]), PAGE_WAV_RATE,
             subtype="PCM_16")
    return path

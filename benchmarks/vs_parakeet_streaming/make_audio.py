"""espeak-ng speech at 16 kHz mono PCM16: one sentence, and sentences concatenated to ~20 s.

    .venv/bin/python -m benchmarks.vs_parakeet_streaming.make_audio results/vs_parakeet_streaming/audio
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Streaming speech recognition turns live audio into text while people are still talking.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Six spoons of fresh snow peas, five thick slabs of blue cheese, and maybe a snack for her brother Bob.",
    "We also need a small plastic snake and a big toy frog for the kids.",
    "She can scoop these things into three red bags, and we will go meet her Wednesday at the train station.",
    "The weather forecast says it will rain tomorrow afternoon, so bring an umbrella.",
    "A journey of a thousand miles begins with a single step.",
]


def speak(text: str, voice: str = "en-us") -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        wav = Path(d) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(wav), text], check=True, timeout=60)
        x, sr = sf.read(wav, dtype="float32")
    return soxr.resample(x, sr, 16000).astype(np.float32)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sf.write(out / "sentence.wav", speak(SENTENCES[0]), 16000, subtype="PCM_16")
    parts, total, gap = [], 0, np.zeros(4000, np.float32)  # 0.25 s between sentences
    for i in range(40):  # bounded
        s = speak(SENTENCES[i % len(SENTENCES)], voice=["en-us", "en"][i % 2])
        parts += [s, gap]
        total += len(s) + len(gap)
        if total >= 20 * 16000:
            break
    x = np.concatenate(parts)[: 20 * 16000]
    sf.write(out / "speech20.wav", x, 16000, subtype="PCM_16")
    print(f"sentence.wav {sf.info(out / 'sentence.wav').duration:.2f}s, speech20.wav {len(x) / 16000:.2f}s")


if __name__ == "__main__":
    main()

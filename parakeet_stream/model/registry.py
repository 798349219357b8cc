"""The named models: what `--model demo|small|large|multilingual` and `--diarizer demo|sortformer` mean."""

from __future__ import annotations

from pathlib import Path

REPO_WEIGHTS = Path(__file__).resolve().parents[2] / "weights"

# name -> Hugging Face repository (None: bundled in the repository's weights/)
NAMED_MODELS: dict[str, str | None] = {
    "demo": None,
    "small": "nvidia/parakeet_realtime_eou_120m-v1",
    "large": "nvidia/nemotron-speech-streaming-en-0.6b",
    "multilingual": "nvidia/nemotron-3.5-asr-streaming-0.6b",  # a language per stream, or its own language ID
}
# `--diarizer` names -> Hugging Face repository (None: bundled in weights/demo-diarizer)
NAMED_DIARIZERS: dict[str, str | None] = {
    "demo": None,
    "sortformer": "nvidia/diar_streaming_sortformer_4spk-v2",
}
HUB_ALIASES = {name: repo for name, repo in NAMED_MODELS.items() if repo is not None}

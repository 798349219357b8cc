"""Which Streaming Sortformer a `--diarizer` names, loaded, and its live streaming settings by the
latency they give (the diarize stage that runs it: diarizer.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..audio import SAMPLE_RATE
from ..model import hub
from ..model.config import UnsupportedModel
from ..model.registry import NAMED_DIARIZERS, REPO_WEIGHTS
from ..model.sortformer import Sortformer, SortformerConfig, StreamingConfig

# The model card's live settings (80 ms frames), by the audio a chunk waits for: its frames and its
# right context. 1.04 s: chunks of 0.48 s seen with 0.56 s after them; 0.32 s: 0.24 s with 0.08 s.
LATENCIES = {
    1.04: dict(chunk_len=6, chunk_left_context=1, chunk_right_context=7, fifo_len=188, spkcache_len=188,
               spkcache_update_period=144),
    0.32: dict(chunk_len=3, chunk_left_context=1, chunk_right_context=1, fifo_len=188, spkcache_len=188,
               spkcache_update_period=144),
}
DEFAULT_LATENCY = 1.04


def diarizer_path(name: str | Path) -> Path:
    """Where a `--diarizer` is: `demo` (bundled: synthetic voices only, as the demo recogniser),
    `sortformer` (NVIDIA's four-speaker model) or ORG/NAME[@REVISION] from the Hugging Face hub
    (downloaded once), a .nemo file or a folder holding one."""
    name = str(name)
    repo = NAMED_DIARIZERS.get(name, name)
    if repo is None:
        return REPO_WEIGHTS / "demo-diarizer"
    if not Path(name).exists() and hub.is_hub_name(repo):
        return hub.checkpoint(repo, _check_sortformer)
    return Path(name)


def _check_sortformer(cfg: dict, repo: str) -> None:
    try:
        SortformerConfig.from_nemo(cfg)
    except (UnsupportedModel, KeyError, TypeError, ValueError) as exc:
        raise UnsupportedModel(f"{repo} is not a Streaming Sortformer this server runs: {exc}") from None


def load_diarizer(name: str | Path) -> Sortformer:
    """A Streaming Sortformer by name, or from its .nemo file or a folder holding one (diarizer_path)."""
    path = diarizer_path(name)
    if path.is_dir():
        found = sorted(path.glob("*.nemo"))
        if len(found) != 1:
            raise UnsupportedModel(f"{path}: expected one Sortformer .nemo file in the folder, found {len(found)}")
        path = found[0]
    model = Sortformer.from_nemo(path)
    if model.cfg.features.sample_rate != SAMPLE_RATE:
        raise UnsupportedModel(f"{path}: the diarizer takes {model.cfg.features.sample_rate} Hz audio, "
                               f"the engine {SAMPLE_RATE} Hz")
    return model


def live_streaming(model: Sortformer, latency: float = DEFAULT_LATENCY) -> StreamingConfig:
    """The model's streaming settings for one of LATENCIES (seconds)."""
    if latency not in LATENCIES:
        raise ValueError(f"a diarizer latency of {latency:g} s: one of {', '.join(f'{x:g}' for x in sorted(LATENCIES))}")
    return dataclasses.replace(model.cfg.streaming, **LATENCIES[latency])

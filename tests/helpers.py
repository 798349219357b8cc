"""Small drivers shared by tests."""

from __future__ import annotations

import numpy as np

from parakeet_stream.engine import ASREngine, StreamResult


def collect_until_final(engine: ASREngine, sid: int, timeout: float = 60.0) -> list[StreamResult]:
    out: list[StreamResult] = []
    waited = 0.0
    while waited < timeout:
        if not engine.wait_for_update(sid, timeout=0.5):
            waited += 0.5
        batch = engine.collect(sid)
        out += batch
        if any(r.is_final for r in batch):
            return out
    raise TimeoutError(f"stream {sid} produced no final result")


def tokens_of(results: list[StreamResult]) -> list[int]:
    return [t for r in results for t in r.token_ids]


def run_stream(engine: ASREngine, audio: np.ndarray, lookahead=None, packet: int = 2560) -> list[StreamResult]:
    sid = engine.create_stream(lookahead)
    for i in range(0, len(audio), packet):
        engine.push_audio(sid, audio[i : i + packet])
    engine.finalize(sid)
    return collect_until_final(engine, sid)


def varied_audios(wavs: dict[str, np.ndarray], n: int) -> list[np.ndarray]:
    """n distinct signals cut from the fixture wavs (different offsets, lengths and gains)."""
    base = list(wavs.values())
    out = []
    for i in range(n):
        w = base[i % len(base)]
        start = (i * 997) % 6000
        end = len(w) - (i * 1291) % 9000
        out.append((w[start:end] * (0.6 + 0.1 * (i % 5))).astype(np.float32))
    return out

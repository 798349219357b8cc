"""The compiled encoder (engine/compiled.py, `ASREngine(compile=True)`) on CPU: the same tokens
as the eager encoder in float32, at every batch size bucket, with nothing compiled at run time."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from helpers import collect_until_final, run_stream, tokens_of, varied_audios

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.compiled import buckets
from parakeet_stream.model.loading import load_model


@pytest.mark.parametrize("max_batch", [1, 2, 3, 4, 8, 100])
def test_buckets_pad_by_less_than_half(max_batch):
    sizes = buckets(max_batch)
    assert sizes[0] == 1 and sizes[-1] == max_batch and sizes == sorted(set(sizes))
    for n in range(1, max_batch + 1):
        assert (next(s for s in sizes if s >= n) - n) / n < 1


def _inductor_problem() -> str | None:
    """Why inductor cannot compile on this machine (no C++ compiler, ...), or None."""
    try:
        torch.compile(lambda x: x * 2 + 1, dynamic=False)(torch.ones(3))
    except Exception as exc:  # noqa: BLE001 - any failure here means: cannot test, not a bug
        return f"{type(exc).__name__}: {exc}"
    return None


def test_compiled_encoder_gives_the_eager_tokens_in_float32(wavs):
    problem = _inductor_problem()
    if problem:
        pytest.skip(f"torch.compile (inductor) cannot compile here: {problem}")
    model = load_model("demo")
    audios = varied_audios(wavs, 6)
    with ASREngine(model, max_num_streams=4) as plain:
        expected = [tokens_of(run_stream(plain, a)) for a in audios]
    with ASREngine(model, max_num_streams=4, compile=True) as engine:
        runner = engine.runner
        runner.cache.keys[:, runner.slots] = float("nan")  # padding rows write the scratch slot only
        compiled = counters["frames"]["total"]
        together = _streams_together(engine, audios[:4]) + _streams_together(engine, audios[4:])
        assert counters["frames"]["total"] == compiled  # every graph was compiled at start-up
        (static,) = runner.encoders.values()
        assert static.sizes == [1, 2, 4] and set(static.capture_seconds) == {1, 2, 4}
        assert static.replays > 0 and static.eager_calls == 0
    assert together == expected and sum(map(len, expected)) > 20


def _streams_together(engine: ASREngine, audios) -> list[list[int]]:
    """Tokens of `audios` sent side by side, so steps batch them (sizes 1 to len(audios))."""
    sids = [engine.create_stream() for _ in audios]
    for at in range(0, max(len(a) for a in audios), 2400):
        for sid, a in zip(sids, audios):
            if at < len(a):
                engine.push_audio(sid, a[at : at + 2400])
    for sid in sids:
        engine.finalize(sid)
    return [tokens_of(collect_until_final(engine, sid)) for sid in sids]

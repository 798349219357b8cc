"""A step's results as columns (engine/result_rows.py): what the engine process sends a worker, and
what the worker builds from them; the same results as the engine builds for its own streams."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from helpers import behind_service, collect_until_final, run_stream, varied_audios

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.ipc.messages import Framer, FromEngine
from parakeet_stream.engine.result_rows import ResultRows
from parakeet_stream.engine.results import DecoderProgress, ResultBuilder

ROWS = [  # stream id, tokens (id, frame in chunk, probability), frames, final, latency, eou
    (7, [(5, 0, 0.5), (9, 3, 0.25)], 4, False, 0.125, 0.75),
    (3, [], 4, False, 0.5, 0.0),
    (7, [(11, 1, 1.0)], 0, True, None, 0.0),
]


def test_rows_cross_the_socket_unchanged_and_build_the_results_the_engine_builds(eou_model):
    tok = eou_model.tokenizer
    framer = Framer(FromEngine)
    sent = ResultRows.of(ROWS)
    (got,) = framer.feed(Framer(FromEngine).frame(sent.message()))
    rows = ResultRows.from_message(got)
    for name in ("sids", "frames", "final", "latency", "eou", "counts", "ids", "at", "probs"):
        np.testing.assert_array_equal(getattr(rows, name), getattr(sent, name))

    builder = ResultBuilder(eou_model.frame_seconds, tok.eou_id, 10)
    progress = {7: DecoderProgress(tok), 3: DecoderProgress(tok)}
    built = rows.results(builder, progress.get)
    expected_progress = {7: DecoderProgress(tok), 3: DecoderProgress(tok)}
    expected = [builder.build(sid, expected_progress[sid], tokens, frames, final, latency, eou)
                for sid, tokens, frames, final, latency, eou in ROWS]
    assert built == expected and [r.stream_id for r in built] == [7, 3, 7] and built[-1].is_final
    assert built[0].token_confidences == [0.5, 0.25] and built[0].latency == 0.125 and built[2].latency is None
    assert [r.stream_id for r in rows.results(builder, {3: DecoderProgress(tok)}.get)] == [3]  # 7 is gone: skipped


def test_rows_whose_columns_do_not_match_are_refused():
    good = ResultRows.of(ROWS).message()
    with pytest.raises(ValueError, match="do not match"):
        ResultRows.from_message(msgspec.structs.replace(good, counts=good.counts[:-4]))
    with pytest.raises(ValueError, match="do not match"):
        ResultRows.from_message(msgspec.structs.replace(good, ids=good.ids + good.ids))


def test_a_worker_s_streams_get_the_engine_s_own_results_and_the_engine_keeps_none(tiny_model_dir, wavs):
    """Through the engine service every result is built in the client from rows: equal, field by
    field (latency aside), to the engine's own for the same audio, and the engine process holds no
    result and no stream once each final went out."""
    audios = varied_audios(wavs, 4)
    with ASREngine(tiny_model_dir, max_num_streams=4) as engine:
        own = [run_stream(engine, audio) for audio in audios]
        with behind_service(engine) as client:
            sids = [client.create_stream() for _ in audios]
            for sid, audio in zip(sids, audios):
                for start in range(0, audio.size, 1600):
                    client.push_audio(sid, audio[start:start + 1600])
                client.finalize(sid)
            remote = [collect_until_final(client, sid) for sid in sids]
            assert not any(engine._seqs.get(sid) for sid in sids)  # forgotten at their finals
    assert sum(len(r.token_ids) for results in own for r in results) > 0
    for mine, theirs in zip(own, remote):  # (probabilities: batched with other streams or not, float32's last bits)
        mine, theirs = _merged(mine), _merged(theirs)
        assert theirs.pop("confidences") == pytest.approx(mine.pop("confidences"), rel=1e-5, abs=1e-6)
        assert mine == theirs


def _merged(results) -> dict:
    """A stream's results as one (packets differ: chunks may group differently), latency aside."""
    return {"ids": [t for r in results for t in r.token_ids], "text": "".join(r.text for r in results),
            "times": [t for r in results for t in r.token_times],
            "confidences": [c for r in results for c in r.token_confidences],
            "ends": [r.end for r in results if r.utterance_end], "audio": results[-1].audio_seconds,
            "finals": [r.is_final for r in results].count(True)}


def test_rows_that_do_not_match_end_only_the_streams_they_name(tiny_model_dir, wavs, caplog):
    """A broken Rows message from the engine: the streams it names end with `inference_error`, the
    worker's other streams keep being served to their finals."""
    audio = varied_audios(wavs, 1)[0]
    with ASREngine(tiny_model_dir, max_num_streams=2) as engine, behind_service(engine) as client:
        named, other = client.create_stream(), client.create_stream()
        good = ResultRows.of([(named, [(5, 0, 0.5)], 4, False, 0.1, 0.0)]).message()
        client._handle(msgspec.structs.replace(good, ids=good.ids + good.ids))
        (result,) = client.collect(named)
        assert result.is_final and result.error == "inference_error"
        assert "result rows refused" in caplog.text
        for start in range(0, audio.size, 1600):
            client.push_audio(other, audio[start:start + 1600])
        client.finalize(other)
        results = collect_until_final(client, other)
        assert results[-1].is_final and not any(r.error for r in results) and any(r.token_ids for r in results)

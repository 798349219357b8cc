"""ASREngine: cross-stream batching, slot reuse, lifecycle edge cases and fault isolation."""

from __future__ import annotations

import gc
import resource
import threading
import time

import numpy as np
import pytest
from helpers import MOVING, collect_until_final, run_stream, tokens_of, varied_audios

from parakeet_stream.engine import ASREngine, EngineError, QueueFull


def test_32_streams_random_packets_match_solo(eou_model, wavs):
    audios = varied_audios(wavs, 32)
    with ASREngine(eou_model, max_num_streams=32) as engine:
        solo = [tokens_of(run_stream(engine, a)) for a in audios]
        assert sum(len(s) for s in solo) > 32, "fixture model should emit tokens"
        rng = np.random.default_rng(7)
        sids = [engine.create_stream() for _ in audios]
        offsets = [0] * len(audios)
        open_streams = list(range(len(audios)))
        while open_streams:
            i = open_streams[rng.integers(len(open_streams))]
            n = int(rng.integers(16, 8000))  # 1 ms .. 500 ms
            engine.push_audio(sids[i], audios[i][offsets[i] : offsets[i] + n])
            offsets[i] += n
            if offsets[i] >= len(audios[i]):
                engine.finalize(sids[i])
                open_streams.remove(i)
        together = [tokens_of(collect_until_final(engine, sid)) for sid in sids]
    assert together == solo


def test_steps_driven_by_hand_give_what_the_threads_give(eou_model, wavs):
    """ASREngine.step() is the whole step the stage threads run spread out: called in a loop on
    one thread, with the stage threads never started, every stream gets the same tokens."""
    audios = varied_audios(wavs, 6)
    with ASREngine(eou_model, max_num_streams=6) as engine:
        threaded = [tokens_of(run_stream(engine, a)) for a in audios]
    engine = ASREngine(eou_model, max_num_streams=3)  # not started: half the streams queue for a slot
    sids = [engine.create_stream() for _ in audios]
    for sid, audio in zip(sids, audios):
        engine.push_audio(sid, audio)
        engine.finalize(sid)
    results = {sid: [] for sid in sids}
    steps = 0
    while not all(r and r[-1].is_final for r in results.values()):
        step = engine.step()
        assert step is not None and step.seconds.keys() == {"pre-encode", "encode", "decode", "results"}
        steps += 1
        for sid in sids:
            results[sid] += engine.collect(sid)
    assert steps >= 2 and [tokens_of(results[sid]) for sid in sids] == threaded
    assert engine.step_totals().steps == steps and engine.stats()["active"] == 0


def test_modes_batched_per_lookahead_match_solo(nemotron_model, wavs):
    audios = varied_audios(wavs, 8)
    modes = nemotron_model.cfg.encoder.att_context_sizes
    with ASREngine(nemotron_model, max_num_streams=8) as engine:
        solo = [tokens_of(run_stream(engine, a, modes[i % len(modes)])) for i, a in enumerate(audios)]
        sids = [engine.create_stream(modes[i % len(modes)]) for i in range(len(audios))]
        for step in range(0, max(len(a) for a in audios), 1600):
            for sid, a in zip(sids, audios):
                if step < len(a):
                    engine.push_audio(sid, a[step : step + 1600])
        for sid in sids:
            engine.finalize(sid)
        assert [tokens_of(collect_until_final(engine, sid)) for sid in sids] == solo


def chunks_per_step(engine: ASREngine) -> dict[int, int]:
    """Spy on the encoder stage: the most chunks each stream had in one step, by stream id."""
    most: dict[int, int] = {}
    real = engine.runner.encode

    def encode(step):
        for item in step:
            most[item.seq.stream_id] = max(most.get(item.seq.stream_id, 0), item.chunks)
        return real(step)

    engine.runner.encode = encode
    return most


def test_bulk_streams_beside_live_ones_match_solo(eou_model, wavs):
    """Files (pushed whole, many chunks a step) beside live streams (pushed in 100 ms packets)."""
    audios = varied_audios(wavs, 6)
    with ASREngine(eou_model, max_num_streams=6) as engine:
        solo = [tokens_of(run_stream(engine, a)) for a in audios]
        most = chunks_per_step(engine)
        files = [engine.create_stream(bulk=True) for _ in audios[:3]]
        live = [engine.create_stream() for _ in audios[3:]]
        for sid, a in zip(files, audios[:3]):
            engine.push_audio(sid, a)
            engine.finalize(sid)
        for step in range(0, max(len(a) for a in audios[3:]), 1600):
            for sid, a in zip(live, audios[3:]):
                if step < len(a):
                    engine.push_audio(sid, a[step : step + 1600])
        for sid in live:
            engine.finalize(sid)
        assert [tokens_of(collect_until_final(engine, sid)) for sid in files + live] == solo
    assert max(most[sid] for sid in files) > 1


def test_bulk_streams_take_the_longest_lookahead_unless_told(nemotron_model, wavs):
    audios = varied_audios(wavs, 4)
    with ASREngine(nemotron_model, max_num_streams=4, lookahead=(70, 1)) as engine:
        assert engine.info.bulk_lookahead == (70, 13) and engine.info.default_lookahead == (70, 1)
        told = [None, None, (70, 0), (70, 6)]
        solo = [tokens_of(run_stream(engine, a, mode or (70, 13))) for a, mode in zip(audios, told)]
        sids = [engine.create_stream(mode, bulk=True) for mode in told]
        for sid, a in zip(sids, audios):
            engine.push_audio(sid, a)
            engine.finalize(sid)
        assert [tokens_of(collect_until_final(engine, sid)) for sid in sids] == solo


def test_a_server_of_chosen_modes_has_static_batches_for_those_only_and_refuses_the_others(nemotron_model, wavs):
    """`modes` (--lookahead-modes): graphs for the modes served only (the start-up's largest part),
    the default among them, files in the longest of them, any other mode refused by name; a served
    mode's tokens the same as with every mode served."""
    audio = varied_audios(wavs, 1)[0]
    with ASREngine(nemotron_model, max_num_streams=2, cuda_graphs=True) as every:
        assert set(every.runner.encoders) == set(nemotron_model.cfg.encoder.att_context_sizes)
        want = {mode: tokens_of(run_stream(every, audio, mode)) for mode in ((70, 1), (70, 6))}
    with ASREngine(nemotron_model, max_num_streams=2, cuda_graphs=True, modes=[(70, 6), (70, 1), (70, 6)]) as chosen:
        assert chosen.info.lookahead_modes == ((70, 6), (70, 1))
        assert set(chosen.runner.encoders) == set(chosen.runner.decoders) == set(chosen.runner.pre_encoders) \
            == {(70, 6), (70, 1)}
        # the model's default (70,13) not served: the first served; files: the longest served
        assert chosen.info.default_lookahead == (70, 6) and chosen.info.bulk_lookahead == (70, 6)
        assert {mode: tokens_of(run_stream(chosen, audio, mode)) for mode in want} == want
        with pytest.raises(EngineError) as err:
            chosen.create_stream((70, 13))
        assert err.value.code == "bad_lookahead" and "not served here (served: 70,6, 70,1)" in err.value.message
    with ASREngine(nemotron_model, max_num_streams=2, modes=[(70, 1), (70, 13)]) as two:  # the model's default served
        assert two.info.default_lookahead == (70, 13)
    for bad in ([(70, 5)], []):
        with pytest.raises(EngineError) as err:
            ASREngine(nemotron_model, max_num_streams=2, modes=bad)
        assert err.value.code == "bad_lookahead"
    with pytest.raises(EngineError, match="not served here"):
        ASREngine(nemotron_model, max_num_streams=2, modes=[(70, 1)], lookahead=(70, 13))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def test_slot_reused_1000_times_leaks_nothing(eou_model, wavs):
    audio = wavs["sentence"][:8000]
    with ASREngine(eou_model, max_num_streams=1) as fresh:
        expected = tokens_of(run_stream(fresh, wavs["sentence"]))
    with ASREngine(eou_model, max_num_streams=1) as engine:
        for _ in range(20):
            run_stream(engine, audio)
        gc.collect()
        threads, rss = set(threading.enumerate()), _rss_mb()
        for _ in range(980):
            run_stream(engine, audio)
        gc.collect()
        # no thread started (idle threads of earlier tests in this process may end meanwhile)
        assert set(threading.enumerate()) <= threads
        assert _rss_mb() - rss < 30
        assert tokens_of(run_stream(engine, wavs["sentence"])) == expected
        assert engine.stats()["free_slots"] == 1


def test_finalize_without_audio_and_twice(eou_model):
    with ASREngine(eou_model, max_num_streams=2) as engine:
        sid = engine.create_stream()
        engine.finalize(sid)
        engine.finalize(sid)
        results = collect_until_final(engine, sid)
        assert [r.is_final for r in results] == [True]
        assert results[0].token_ids == [] and results[0].error is None
        assert engine.stats()["free_slots"] == 2


def test_push_after_finalize_is_a_clear_error(eou_model, wavs):
    with ASREngine(eou_model) as engine:
        sid = engine.create_stream()
        engine.push_audio(sid, wavs["sentence"][:4000])
        engine.finalize(sid)
        with pytest.raises(EngineError) as err:
            engine.push_audio(sid, wavs["sentence"][:100])
        assert err.value.code == "stream_closed"
        collect_until_final(engine, sid)


def test_bad_samples_and_lookahead_rejected(eou_model):
    with ASREngine(eou_model) as engine:
        sid = engine.create_stream()
        with pytest.raises(ValueError):
            engine.push_audio(sid, np.array([0.0, np.nan], dtype=np.float32))
        with pytest.raises(EngineError) as err:
            engine.create_stream((70, 13))
        assert err.value.code == "bad_lookahead"
        engine.cancel(sid)


def test_cancel_mid_chunk_frees_slot(eou_model, wavs):
    with ASREngine(eou_model, max_num_streams=1) as engine:
        sid = engine.create_stream()
        engine.push_audio(sid, wavs["sentence"][:5000])  # not a whole number of chunks
        engine.cancel(sid)
        second = engine.create_stream()
        assert engine.queue_position(second) == 0
        engine.push_audio(second, wavs["noise"])
        engine.finalize(second)
        reused = tokens_of(collect_until_final(engine, second))
    with ASREngine(eou_model, max_num_streams=1) as fresh:
        assert reused == tokens_of(run_stream(fresh, wavs["noise"]))


def test_more_streams_than_slots_queue_in_order(eou_model, wavs):
    # (calibrate=False: admission before any step is measured lets a stream in wherever a slot is free;
    # a start-up measurement on a loaded machine could admit fewer than the slots, and queue positions with it)
    with ASREngine(eou_model, max_num_streams=2, max_queue=3, calibrate=False) as engine:
        sids = [engine.create_stream() for _ in range(5)]
        assert [engine.queue_position(s) for s in sids] == [0, 0, 1, 2, 3]
        with pytest.raises(QueueFull):
            engine.create_stream()
        admitted_order = []
        wake = threading.Event()
        for sid in sids:
            engine.add_listener(sid, wake.set)
            engine.push_audio(sid, wavs["sentence"][:6000])
            engine.finalize(sid)
        done = set()
        while len(done) < len(sids):
            for sid in sids:
                if sid in done:
                    continue
                if engine.queue_position(sid) == 0 and sid not in admitted_order:
                    admitted_order.append(sid)
                if any(r.is_final for r in engine.collect(sid)):
                    done.add(sid)
            wake.wait(0.05)
            wake.clear()
        assert admitted_order == sids
        assert engine.stats() | MOVING == {
            "active": 0, "queued": 0, "free_slots": 2, "capacity": 2, "max_num_streams": 2, "max_queue": 3,
            "audio_seconds": 0, "stalled": None, **MOVING,
        }


@pytest.mark.parametrize("stage", ["pre_encode", "encode", "decode"])
def test_worker_exception_fails_only_that_batch(eou_model, wavs, stage):
    audios = varied_audios(wavs, 4)
    with ASREngine(eou_model, max_num_streams=4) as engine:
        expected = [tokens_of(run_stream(engine, a)) for a in audios]
        runner = engine.runner
        real = getattr(runner, stage)
        poisoned: set[int] = set()

        def faulty(batch):
            # chunks of an already failed stream are dropped before any model work, as the stage does
            if {item.seq.stream_id for item in batch if item.live} & poisoned:
                raise RuntimeError("injected fault")
            return real(batch)

        setattr(runner, stage, faulty)
        bad = engine.create_stream()
        poisoned.add(bad)
        engine.push_audio(bad, audios[0])
        engine.finalize(bad)
        bad_results = collect_until_final(engine, bad)
        assert bad_results[-1].error == "inference_error" and bad_results[-1].is_final
        assert [tokens_of(run_stream(engine, a)) for a in audios] == expected
        assert engine.stats()["free_slots"] == 4


def test_a_stage_stalled_on_one_step_is_logged_and_unhealthy_until_it_goes_on(eou_model, wavs, caplog):
    """A stage that never returns (a GPU kernel that never ends) raises nothing: the watchdog must say
    which stage, on which step, and the engine's health must say so until it goes on."""
    audio = varied_audios(wavs, 1)[0]
    with ASREngine(eou_model, max_num_streams=4) as engine:
        expected = tokens_of(run_stream(engine, audio))
        engine.pipeline.stall_seconds = 0.3
        runner, release = engine.runner, threading.Event()
        real = runner.decode

        def stuck(step):
            release.wait(30)
            return real(step)

        runner.decode = stuck
        sid = engine.create_stream()
        engine.push_audio(sid, audio)
        engine.finalize(sid)
        deadline = time.monotonic() + 9  # the limit: 0.3 s, or ten times the longest step so far
        while engine.healthy() and time.monotonic() < deadline:
            time.sleep(0.02)
        stall = engine.stats()["stalled"]
        assert not engine.healthy() and stall["stage"] == "decode" and stall["streams"] == 1, stall
        assert stall["seconds"] >= 0.3 and stall["batches"] and stall["device_at"] is None  # no marks on CPU
        time.sleep(1.2)  # the watchdog's look
        runner.decode = real
        release.set()
        assert tokens_of(collect_until_final(engine, sid)) == expected
        assert engine.healthy() and engine.stats()["stalled"] is None
        time.sleep(1.2)
    logged = [r.getMessage() for r in caplog.records if r.name == "parakeet_stream.engine.pipeline"]
    assert sum("stalled: stage decode" in m for m in logged) == 1, logged
    assert any("went on after a stall" in m for m in logged), logged


def test_a_burst_of_idle_streams_is_admitted_at_the_pace_without_audio(eou_model):
    """Past the streams proven in time, a burst waits for admission's pace, not for steps: streams
    that send nothing yet must not hold the ones behind them in the queue."""
    with ASREngine(eou_model, max_num_streams=64) as engine:
        sids = [engine.create_stream() for _ in range(40)]
        assert engine.stats()["queued"] > 0
        deadline = time.monotonic() + 5
        while engine.stats()["queued"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.stats()["active"] == 40 and all(engine.queue_position(s) == 0 for s in sids)

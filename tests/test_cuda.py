"""The GPU path, on a CUDA device only (skipped elsewhere): what CPU tests cannot see. These are what
scripts/gpu_check.sh runs first on a new GPU machine.

- every mode x size CUDA graph against the eager model: outputs, slots not in a step untouched, a
  NaN-filled scratch slot, past the key/value ring's wrap (tests/static_checks.py);
- the engine through graphs gives the eager engine's tokens, and never falls back to eager;
- graphs are all captured before serving: 32 mixed-mode streams pushed from threads, no inference_error;
- a steady-state step syncs the host only to fetch its tokens;
- float16 / bfloat16 activations finite in every layer; float32 without TF32, token-exact with CPU;
- every stage thread on the engine's device; each stage's graphs captured on its own stream;
- the diarizer's rounds from CUDA graphs give the eager diarizer's speaker decisions.
"""

from __future__ import annotations

import copy
import threading
import warnings

import numpy as np
import pytest
import torch
from conftest import NEMO
from helpers import collect_until_final, diarized_speakers, run_stream, tokens_of, varied_audios
from static_checks import check_decoder, check_encoder, runner_on

from parakeet_stream.engine import ASREngine
from parakeet_stream.model.precision import set_precision
from parakeet_stream.model.sortformer import Sortformer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MODELS = ["eou_model", "nemotron_model"]


def on_cuda(model, dtype: str = "float32", index: int = 0):
    """A copy of a fixture model on the GPU (the fixtures stay on CPU)."""
    return set_precision(copy.deepcopy(model).to(f"cuda:{index}"), dtype)


def _graphs(engine: ASREngine) -> list:
    return [*engine.runner.encoders.values(), *engine.runner.decoders.values()]


@pytest.mark.parametrize("model_name", MODELS)
def test_every_mode_and_size_graph_equals_eager(request, model_name):
    model = request.getfixturevalue(model_name)
    runner = runner_on(model, "cuda")
    for mode in model.cfg.encoder.att_context_sizes:
        assert runner.encoders[mode].graphs and len(runner.encoders[mode]._graphs) == len(runner.encoders[mode].sizes)
        assert check_encoder(runner, mode, atol=1e-4) > runner.cache.keys.size(2)  # the ring wrapped
        emitted, redone = check_decoder(runner, mode)
        assert emitted > 0 and redone > 0  # the bounded pass's unfinished rows, decoded again
        assert runner.encoders[mode].eager_calls == runner.decoders[mode].eager_calls == 0


def _streams(engine: ASREngine, audios, modes, threads: bool) -> list[list[int]]:
    sids = [engine.create_stream(modes[i % len(modes)]) for i in range(len(audios))]

    def push(sid, audio):
        for at in range(0, len(audio), 1280):
            engine.push_audio(sid, audio[at : at + 1280])
        engine.finalize(sid)

    if threads:
        pushers = [threading.Thread(target=push, args=pair) for pair in zip(sids, audios)]
        for t in pushers:
            t.start()
        for t in pushers:
            t.join()
    else:
        for pair in zip(sids, audios):
            push(*pair)
    results = [collect_until_final(engine, sid) for sid in sids]
    assert not [r.error for rs in results for r in rs if r.error]
    return [tokens_of(rs) for rs in results]


def test_engine_graphs_equal_eager_and_are_never_bypassed(nemotron_model, wavs):
    audios = varied_audios(wavs, 8)
    modes = nemotron_model.cfg.encoder.att_context_sizes
    with ASREngine(nemotron_model, max_num_streams=8) as cpu:
        expected = _streams(cpu, audios, modes, threads=False)
    with ASREngine(on_cuda(nemotron_model), "cuda", max_num_streams=8, cuda_graphs=False) as eager:
        assert _streams(eager, audios, modes, threads=False) == expected
    with ASREngine(on_cuda(nemotron_model), "cuda", max_num_streams=8) as engine:
        engine.runner.cache.keys[:, engine.runner.slots] = float("nan")
        assert _streams(engine, audios, modes, threads=False) == expected
        assert sum(g.replays for g in _graphs(engine)) > 0 and sum(g.eager_calls for g in _graphs(engine)) == 0


def test_32_mixed_mode_streams_pushed_from_threads_capture_nothing_and_fail_nothing(nemotron_model, wavs):
    audios = varied_audios(wavs, 32)
    modes = nemotron_model.cfg.encoder.att_context_sizes
    with ASREngine(nemotron_model, max_num_streams=32) as cpu:
        expected = _streams(cpu, audios, modes, threads=False)
    with ASREngine(on_cuda(nemotron_model), "cuda", max_num_streams=32) as engine:
        captured = [len(g._graphs) for g in _graphs(engine)]
        assert _streams(engine, audios, modes, threads=True) == expected
        assert [len(g._graphs) for g in _graphs(engine)] == captured
        assert sum(g.eager_calls for g in _graphs(engine)) == 0


def test_a_steady_state_step_syncs_only_for_its_tokens(eou_model, wavs):
    engine = ASREngine(on_cuda(eou_model), "cuda", max_num_streams=4)  # not started: the test runs its steps
    for sid in [engine.create_stream() for _ in range(3)]:
        engine.push_audio(sid, wavs["sentence"][:48000])
    steps_synced = []
    for _ in range(3):  # the first step warms up (first chunks, lazy allocations)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step = engine.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert step.batches and all(item.tokens for item in step)
        steps_synced.append([str(w.message) for w in caught if "synchroniz" in str(w.message)])
    assert all(len(synced) <= 1 for synced in steps_synced[1:]), steps_synced  # at most the token copy


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("model_name", MODELS)
def test_reduced_precision_activations_are_finite_in_every_layer(request, model_name, dtype, wavs):
    model = on_cuda(request.getfixturevalue(model_name), dtype)
    encoder, bad = model.encoder, []

    def check(module, args, out, name):
        out = out[0] if isinstance(out, tuple) else out
        if not torch.isfinite(out).all():
            bad.append(name)

    layers = [("pre_encode", encoder.pre_encode), *((f"layer {i}", layer) for i, layer in enumerate(encoder.layers))]
    for name, module in layers:
        module.register_forward_hook(lambda m, a, o, name=name: check(m, a, o, name))
    with ASREngine(model, "cuda", max_num_streams=4, dtype=dtype, cuda_graphs=False) as engine:  # hooks: eager
        for mode in model.cfg.encoder.att_context_sizes:
            for audio in wavs.values():
                assert tokens_of(run_stream(engine, audio, mode))
    assert bad == []


def test_float32_on_cuda_has_tf32_off_and_the_cpu_tokens_in_every_mode(nemotron_model, wavs):
    modes = nemotron_model.cfg.encoder.att_context_sizes
    with ASREngine(nemotron_model, max_num_streams=4) as cpu:
        expected = {(w, m): tokens_of(run_stream(cpu, a, m)) for w, a in wavs.items() for m in modes}
    with ASREngine(on_cuda(nemotron_model), "cuda", max_num_streams=4) as engine:
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        got = {(w, m): tokens_of(run_stream(engine, a, m)) for w, a in wavs.items() for m in modes}
    assert got == expected


def test_every_stage_thread_runs_on_the_engines_device(eou_model, wavs):
    index = torch.cuda.device_count() - 1  # the last GPU: not the default one where there are several
    with ASREngine(on_cuda(eou_model, index=index), f"cuda:{index}", max_num_streams=2) as engine:
        seen, runner = {}, engine.runner
        for stage in ("pre_encode", "encode", "decode"):
            real = getattr(runner, stage)

            def spy(step, real=real, stage=stage):
                seen[stage] = (torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream)
                return real(step)

            setattr(runner, stage, spy)
        run_stream(engine, wavs["sentence"])
    assert {device for device, _ in seen.values()} == {index}
    assert len({stream for _, stream in seen.values()}) == 3  # a stream per stage


def test_each_stages_graphs_are_captured_on_the_stream_that_replays_them(nemotron_model):
    """A captured GEMM keeps its capture stream's cuBLAS workspace: graphs captured on one stream and
    replayed side by side on the stage streams would race in one workspace (cuda_graphs.py)."""
    runner = runner_on(nemotron_model, "cuda")
    stages = {"pre-encode": [runner.pre_encoders], "encode": [runner.encoders],
              "decode": [runner.decoders, runner.beam_decoders]}
    for stage, groups in stages.items():
        stream = runner.cuda_streams.stream(stage)
        assert all(static.stream is stream and static._graphs for group in groups for static in group.values()), stage
    assert len({runner.cuda_streams.stream(stage).cuda_stream for stage in stages}) == 3


def test_auto_sizing_fits_after_every_graph_is_captured(eou_model):
    with ASREngine(on_cuda(eou_model), "cuda", max_num_streams="auto", max_batch=64) as engine:
        slots, batch = engine.scheduler.max_num_streams, engine.scheduler.max_batch
        assert 1 <= batch <= 64 and batch <= slots
        free, total = torch.cuda.mem_get_info()
        assert free > 0.02 * total  # the plan left room after pools, graphs and their pools


def test_a_steps_marks_name_the_first_operation_the_gpu_has_not_finished():
    """What a stall's report names: each stage marks its operations; a mark whose event the device
    has not passed is the operation the device is still on (here: one held back by a waiting event)."""
    from parakeet_stream.engine.step import Step
    from parakeet_stream.engine.runner.cuda_streams import StageStreams, device_at

    streams, step = StageStreams(torch.device("cuda"), ["encode"]), Step([], 0.0)
    streams.enter("encode")
    streams.mark(step, "encoder cache reset", 3)
    torch.cuda.current_stream().synchronize()
    gate = torch.cuda.Event()  # recorded later on another stream: what the encode stream waits for
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        torch.cuda._sleep(int(5e8))  # about a quarter of a second of GPU time
        gate.record()
    torch.cuda.current_stream().wait_event(gate)
    streams.mark(step, "encode", 40, (70, 1))
    assert device_at(step) == "encode (70, 1) x 40"
    torch.cuda.synchronize()
    assert device_at(step) is None


def test_diarizer_graphs_give_the_eager_speaker_decisions(eou_model, wavs):
    """Three diarized streams in steps of sizes 1, 2, 4 (a padding row): each round replayed from a graph
    captured on the decode stage's stream (its thread runs the diarizer), counted in the start-up's
    graphs; every frame's speaker decisions as the eager diarizer's."""
    sortformer = Sortformer.from_nemo(NEMO / "sortformer_tiny.nemo")
    audios = varied_audios(wavs, 3)

    def speakers(graphs: bool) -> list[np.ndarray]:
        with ASREngine(on_cuda(eou_model), "cuda", max_num_streams=4, max_batch=4, cuda_graphs=graphs,
                       diarizer=copy.deepcopy(sortformer)) as engine:
            out = diarized_speakers(engine, audios)
            static = engine.diarizer.static
            if graphs:
                assert static.stream is engine.runner.cuda_streams.stream("decode")
                assert len(static._graphs) == len(static.sizes) == 3 and static.replays > 0 and static.eager_calls == 0
                assert engine.info.cuda_graphs == engine.runner.graph_count + 3
            else:
                assert static is None and engine.info.cuda_graphs == 0
        return out

    for a, b in zip(speakers(True), speakers(False)):
        assert a.shape == b.shape and len(a) > 20 and np.abs(a - b).max() < 1e-3
        assert np.array_equal(a > 0.5, b > 0.5)

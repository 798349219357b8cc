"""Static batches (engine/runner/cuda_graphs.py) on CPU, with the eager stand-in for CUDA graph replays:
the sizes, padding rows into the scratch slot, copies out, and the engine's tokens through them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import collect_until_final, run_stream, tokens_of, varied_audios
from static_checks import check_decoder, check_encoder, runner_on

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.runner.cuda_graphs import StaticBatches, graph_sizes


@pytest.mark.parametrize("max_batch", [1, 7, 8, 100, 513, 1024, 4096])
def test_graph_sizes_powers_of_two_then_pad_by_less_than_an_eighth(max_batch):
    sizes = graph_sizes(max_batch)
    assert sizes[0] == 1 and sizes[-1] == max_batch and sizes == sorted(set(sizes))
    assert [s for s in sizes[:-1] if s < 64] == [2**k for k in range(7) if 2**k < min(64, max_batch)]
    for n in range(64, max_batch + 1):
        size = next(s for s in sizes if s >= n)
        assert (size - n) / size < 0.125, (n, size)
    assert len(sizes) <= 7 + 6 * np.ceil(max(0, np.log2(max_batch / 64))) + 1  # ~6 per doubling, not one per row


class Recorder:
    """A stand-in for a model function: row i of the output is x[i] + slot[i]; it logs what it saw."""

    def __init__(self):
        self.seen: list[tuple[list[int], list[int]]] = []

    def __call__(self, x, lengths, slots, fixed=False):
        self.seen.append((lengths.tolist(), slots.tolist()))
        return x + slots.unsqueeze(1)


def make_static(max_batch: int = 40):
    sizes = [n for n in range(1, max_batch + 1) if n <= 16 or n % 2 == 0]  # 1 ... 16, 18, 20, 22, ...
    fn = Recorder()
    static = StaticBatches("test", fn, lambda n: (torch.zeros(n, 3), torch.zeros(n, dtype=torch.long),
                                                  torch.zeros(n, dtype=torch.long)),
                           (None, 0, 99), max_batch, graphs=False, sizes=sizes)
    static.capture()
    fn.seen.clear()
    return static, fn


def test_a_batch_runs_at_the_next_size_with_padding_rows_on_the_scratch_slot():
    static, fn = make_static()
    out = static(torch.ones(3, 3), torch.tensor([2, 3, 1]), torch.tensor([4, 0, 2]))
    assert torch.equal(out, torch.ones(3, 3) + torch.tensor([[4.0], [0.0], [2.0]]))
    (lengths, slots), = fn.seen
    assert len(slots) == 3 and lengths == [2, 3, 1] and slots == [4, 0, 2]  # 3 is a size
    static(torch.ones(17, 3), torch.full((17,), 2), torch.arange(17))
    lengths, slots = fn.seen[-1]
    assert len(slots) == 18 and lengths[17:] == [0] and slots[17:] == [99]
    assert static.replays == 2 and static.eager_calls == 0


def test_padding_rows_left_by_a_larger_batch_are_reset():
    static, fn = make_static()
    static(torch.ones(20, 3), torch.full((20,), 5), torch.arange(20))
    static(torch.ones(17, 3), torch.full((17,), 5), torch.arange(17))  # runs at size 18: row 17 is padding
    lengths, slots = fn.seen[-1]
    assert len(slots) == 18 and lengths[17] == 0 and slots[17] == 99


def test_what_a_call_returns_is_not_overwritten_by_the_next_replay():
    static, _ = make_static()
    first = static(torch.zeros(2, 3), torch.ones(2, dtype=torch.long), torch.tensor([1, 2]))
    kept = first.clone()
    static(torch.full((2, 3), 7.0), torch.ones(2, dtype=torch.long), torch.tensor([5, 6]))
    assert torch.equal(first, kept)


def test_a_batch_past_the_largest_size_runs_eagerly():
    static, fn = make_static(max_batch=4)
    assert static.sizes == [1, 2, 3, 4]
    out = static(torch.zeros(6, 3), torch.ones(6, dtype=torch.long), torch.arange(6))
    assert out.shape == (6, 3) and static.eager_calls == 1 and len(fn.seen[-1][1]) == 6


@pytest.mark.parametrize("model_name", ["eou_model", "nemotron_model"])
def test_static_encoder_and_decoder_equal_eager_in_every_mode(request, model_name):
    model = request.getfixturevalue(model_name)
    runner = runner_on(model, "cpu")
    for mode in model.cfg.encoder.att_context_sizes:
        assert check_encoder(runner, mode) > runner.cache.keys.size(2)  # the ring wrapped
        emitted, redone = check_decoder(runner, mode)
        assert emitted > 0 and redone > 0  # the bounded pass's unfinished rows, decoded again
        assert runner.encoders[mode].replays > 0 and runner.encoders[mode].eager_calls == 0


def test_engine_through_static_batches_gives_the_same_tokens(nemotron_model, wavs):
    audios = varied_audios(wavs, 8)
    modes = nemotron_model.cfg.encoder.att_context_sizes
    with ASREngine(nemotron_model, max_num_streams=8) as plain:
        expected = [tokens_of(run_stream(plain, a, modes[i % len(modes)])) for i, a in enumerate(audios)]
    with ASREngine(nemotron_model, max_num_streams=8, max_batch=6, cuda_graphs=True) as engine:
        runner = engine.runner
        scratch = runner.slots
        runner.cache.keys[:, scratch] = float("nan")
        runner.decoder_state.h[:, scratch] = float("nan")
        sids = [engine.create_stream(modes[i % len(modes)]) for i in range(len(audios))]
        for at in range(0, max(len(a) for a in audios), 2400):
            for sid, a in zip(sids, audios):
                if at < len(a):
                    engine.push_audio(sid, a[at : at + 2400])
        for sid in sids:
            engine.finalize(sid)
        together = [tokens_of(collect_until_final(engine, sid)) for sid in sids]
        used = [*runner.encoders.values(), *runner.decoders.values()]
        assert sum(s.replays for s in used) > 0 and sum(s.eager_calls for s in used) == 0
    assert together == expected and sum(map(len, expected)) > 20

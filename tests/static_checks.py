"""Checks of the runner's static batches (engine/runner/cuda_graphs.py) against the eager model, shared by
the CPU tests (eager stand-in, tests/test_cuda_graphs.py) and the GPU ones (CUDA graphs, tests/test_cuda.py).

Each drives the runner's static encoder or decoder of one lookahead mode with random row subsets of
every size for more steps than the key/value ring holds, beside the same model run eagerly on
a copy of the pools, and asserts: the same outputs, the same state in every real slot (those not in
a step untouched), whatever the scratch slot holds (NaN from the start).
"""

from __future__ import annotations

import copy

import torch

from parakeet_stream.engine.runner.model_runner import ModelRunner
from parakeet_stream.model.device import to_host
from parakeet_stream.model.greedy import GreedyPass, unfinished, unpack, unpack_scored
from parakeet_stream.model.precision import set_precision
from parakeet_stream.model.rnnt import DecoderState

SLOTS, MAX_BATCH = 24, 20  # sizes 1 ... 16, 18, 20: batches of 17 and 19 have a padding row


def runner_on(model, device: str) -> ModelRunner:
    """A runner with static batches (CUDA graphs on CUDA, their eager stand-in on CPU), captured."""
    runner = ModelRunner(set_precision(copy.deepcopy(model).to(device)), SLOTS, MAX_BATCH, graphs=True)
    runner.capture()
    return runner


def _poison_scratch(runner: ModelRunner) -> None:
    cache, state, s = runner.cache, runner.decoder_state, runner.slots
    for t in (cache.keys, cache.values, cache.conv, state.h, state.c):
        t[:, s] = float("nan")
    state.g[s] = float("nan")
    cache.length[s], cache.head[s] = 10**6, 10**6 + 3


def _subsets(steps: int, seed: int):
    """(step, slots): batches of every size from 1 to MAX_BATCH in turn (at least one each), rows shuffled;
    slot 0 in every one (its ring wraps first)."""
    gen = torch.Generator().manual_seed(seed)
    for k in range(max(steps, MAX_BATCH)):
        n = MAX_BATCH - k % MAX_BATCH
        slots = torch.cat((torch.zeros(1, dtype=torch.long), 1 + torch.randperm(SLOTS - 1, generator=gen)[: n - 1]))
        yield k, slots[torch.randperm(n, generator=gen)]


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float = 0.0) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol))


@torch.inference_mode()
def check_encoder(runner: ModelRunner, mode, atol: float = 1e-4) -> int:
    """Returns the most frames a slot took (past the ring's size: its head wrapped)."""
    encoder, dev = runner.model.encoder, runner.device
    frames = encoder.chunk_spec(mode).out_frames
    steps = runner.cache.keys.size(2) // frames + 8
    eager = copy.deepcopy(runner.cache)
    _poison_scratch(runner)
    gen = torch.Generator().manual_seed(1)
    written = torch.zeros(runner.slots, dtype=torch.long)  # frames written into each slot's ring
    for k, slots in _subsets(steps, 0):
        n = slots.numel()
        written[slots] += frames
        x = torch.randn(n, frames, encoder.cfg.d_model, generator=gen).to(dev, runner.model.encoder_dtype)
        lengths = torch.randint(1, frames + 1, (n,), generator=gen).to(dev)
        slots = slots.to(dev)
        ours = runner.encoders[mode](x, lengths, slots)
        theirs = encoder.stream_layers(x, lengths, eager, slots, mode)
        for i, m in enumerate(lengths.tolist()):
            assert _close(ours[i, :m], theirs[i, :m], atol), (mode, k, i)
        real = slice(0, runner.slots)
        for a, b in ((runner.cache.keys, eager.keys), (runner.cache.values, eager.values), (runner.cache.conv, eager.conv)):
            assert _close(a[:, real], b[:, real], atol), (mode, k)
        assert torch.equal(runner.cache.length[real], eager.length[real]) and torch.equal(runner.cache.head[real], eager.head[real])
    return int(written.max())


@torch.inference_mode()
def check_decoder(runner: ModelRunner, mode, steps: int = 10, blank_bias: float = -2.0) -> tuple[int, int]:
    """Returns the labels emitted and the rows the static pass left unfinished (decoded again as
    the runner does). `blank_bias` is added to the joint's blank logit (negative: more labels)."""
    decoder, dev = runner.model.decoder, runner.device
    frames = runner.model.encoder.chunk_spec(mode).out_frames
    eager = copy.deepcopy(runner.decoder_state)
    _poison_scratch(runner)
    gen = torch.Generator().manual_seed(2)
    emitted = redone = 0
    with torch.no_grad():
        decoder.joint.out.bias[-1] += blank_bias
    try:
        for k, slots in _subsets(steps, 3):
            n = slots.numel()
            enc = torch.randn(n, frames, runner.model.cfg.encoder.d_model, generator=gen).to(dev)
            lengths = torch.randint(0, frames + 1, (n,), generator=gen).to(dev)
            slots = slots.to(dev)
            passes = [(mode, enc, lengths, slots)]
            fetched = to_host([runner.decoders[mode](enc, lengths, slots)], dev)
            redone += unfinished(fetched[0]).size
            ours = [[(label, frame) for label, frame, _ in stream]
                    for stream in unpack_scored(runner.step_decoder._finish(passes, fetched)[0])]
            done = GreedyPass(decoder, enc, lengths, eager.gather(slots)).run()
            eager.scatter(slots, DecoderState(*done.state()))
            assert ours == unpack(done.packed().cpu().numpy()), (mode, k)
            emitted += sum(map(len, ours))
            real = slice(0, runner.slots)
            # many labels in a row: the LSTM cell state grows, and with it its rounding
            for a, b in ((runner.decoder_state.h, eager.h), (runner.decoder_state.c, eager.c)):
                assert _close(a[:, real], b[:, real], 1e-5, 1e-4), (mode, k)
            assert _close(runner.decoder_state.g[real], eager.g[real], 1e-5, 1e-4), (mode, k)
    finally:
        with torch.no_grad():
            decoder.joint.out.bias[-1] -= blank_bias
    return emitted, redone

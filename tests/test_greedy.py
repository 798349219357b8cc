"""Label-looping greedy decoding (model/greedy.py) against the frame-looping decoder it replaced
(benchmarks/kernels/frame_looping.py): the same labels at the same frames and the same final state, eagerly
and as a CUDA graph's pass runs them (a bounded pass in fixed shapes, the rows it left unfinished
decoded again eagerly from their state before it, as the engine's runner does)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from benchmarks.kernels.frame_looping import frame_looping

from parakeet_stream.model.config import DecoderConfig, EncoderConfig, ModelConfig
from parakeet_stream.model.greedy import GreedyPass, unpack
from parakeet_stream.model.parakeet import ParakeetModel
from parakeet_stream.model.rnnt import DecoderState


def random_decoder(blank_bias: float, layers: int = 2, max_symbols: int = 3):
    torch.manual_seed(0)
    cfg = ModelConfig(encoder=EncoderConfig(n_layers=1, d_model=32, n_heads=2, subsampling_channels=8, feat_in=16),
                      decoder=DecoderConfig(num_classes=20, pred_hidden=16, joint_hidden=24, max_symbols=max_symbols,
                                            pred_rnn_layers=layers))
    decoder = ParakeetModel(cfg).eval().decoder
    with torch.no_grad():
        decoder.joint.out.bias[-1] = blank_bias  # negative: labels on most frames, max_symbols reached
    return decoder


def fixed_shapes(decoder, enc, lengths, state, window=None) -> tuple[list, DecoderState, int]:
    """The pass as the runner's static batches run it -> (labels per stream, final state, rows left unfinished)."""
    bounded = GreedyPass(decoder, enc, lengths, state, window).run(fixed=True)
    labels = unpack(bounded.packed().numpy())
    h, c, g = bounded.settled(state)
    rows = bounded.active.nonzero().squeeze(1)
    if rows.numel():
        again = GreedyPass(decoder, enc[rows], lengths[rows], DecoderState(h[:, rows], c[:, rows], g[rows]), window).run()
        for r, found in zip(rows.tolist(), unpack(again.packed().numpy())):
            labels[r] = found
        h[:, rows], c[:, rows], g[rows] = again.state()
    return labels, DecoderState(h, c, g), rows.numel()


def same_state(a: DecoderState, b: DecoderState) -> bool:
    return all(torch.allclose(x, y, atol=1e-5) for x, y in ((a.h, b.h), (a.c, b.c), (a.g, b.g)))


@pytest.mark.parametrize("blank_bias", [-3.0, 0.0, 4.0])
@pytest.mark.parametrize("frames", [1, 2, 7, 14, 40])
def test_label_looping_equals_frame_looping(blank_bias, frames):
    decoder = random_decoder(blank_bias)
    gen = torch.Generator().manual_seed(frames)
    batch = 9
    enc = torch.randn(batch, frames, 32, generator=gen)
    lengths = torch.randint(0, frames + 1, (batch,), generator=gen)
    lengths[0] = frames
    state = decoder.initial_state(batch)
    state.h.normal_(generator=gen)
    state.c.normal_(generator=gen)
    with torch.inference_mode():
        expected, expected_state = frame_looping(decoder, enc, lengths, state)
        for window in (None, 1, 3):
            emission, final = decoder.decode(enc, lengths, state, window)
            assert emission.per_stream(batch) == expected, window
            assert same_state(final, expected_state)
            labels, final, unfinished = fixed_shapes(decoder, enc, lengths, state, window)
            assert labels == expected, window
            assert same_state(final, expected_state)
            assert unfinished or blank_bias > 0 or frames == 1  # more labels than the bound: decoded again
    if blank_bias < 0:  # the bound on labels per frame was reached
        assert max(map(len, expected)) == frames * decoder.cfg.max_symbols


def test_the_eager_loop_stays_within_max_iterations():
    decoder = random_decoder(-3.0)
    enc = torch.randn(4, 5, 32)
    with torch.inference_mode():
        p = GreedyPass(decoder, enc, torch.tensor([5, 3, 0, 5]), decoder.initial_state(4))
        iterations = 0
        while bool(p.active.any()):
            p.iterate_active()
            iterations += 1
    assert iterations <= p.max_iterations
    assert p.count.tolist() == [15, 9, 0, 15]  # max_symbols (3) on every valid frame


def test_packed_passes_unpack_per_stream():
    packed = np.array([[2, 7, 8, 0, 0, 1, 0], [0, 5, 5, 5, 9, 9, 9], [1, 3, 0, 0, 1, 0, 0]], np.int32)
    assert unpack(packed) == [[(7, 0), (8, 1)], [], [(3, 1)]]


def test_streamed_chunks_of_a_fixture_model_equal_frame_looping(nemotron_model, wavs):
    """Chunk after chunk, each starting from the state the last one left, as the engine decodes."""
    model, emitted = nemotron_model, 0
    for mode in model.cfg.encoder.att_context_sizes:
        spec = model.encoder.chunk_spec(mode)
        with torch.inference_mode():
            encoded = []
            for audio in wavs.values():
                feats, valid = model.features(torch.from_numpy(audio))
                enc, _ = model.encoder(feats[None], torch.tensor([valid]), mode)
                encoded.append(enc[0])
            chunks = min(e.size(0) for e in encoded) // spec.out_frames
            ours = theirs = model.decoder.initial_state(len(encoded))
            for k in range(chunks):
                enc = torch.stack([e[k * spec.out_frames : (k + 1) * spec.out_frames] for e in encoded])
                lengths = torch.full((len(encoded),), spec.out_frames)
                expected, theirs = frame_looping(model.decoder, enc, lengths, theirs)
                emission, ours = model.decoder.decode(enc, lengths, ours)
                assert emission.per_stream(len(encoded)) == expected, (mode, k)
                emitted += len(emission.token)
    assert emitted > 20


def test_the_label_prior_is_the_prediction_network_alone_label_by_label():
    """label_prior (the key phrases' internal LM) equals stepping the prediction network from the
    start with no audio, each sequence alone: padding a shorter one in the batch changes nothing."""
    decoder = random_decoder(0.0)
    sequences = [[3, 5, 1, 7], [2], [19, 0, 4]]
    got = decoder.label_prior(sequences)
    for seq, prior in zip(sequences, got):
        state = decoder.initial_state(1)
        h, c, g = state.h, state.c, state.g
        want = []
        for label in seq:
            logits = decoder.joint(decoder.joint.enc.bias, g)[0, : decoder.blank]
            want.append(torch.log_softmax(logits, -1)[label].item())
            out, (h, c) = decoder.predictor.step(torch.tensor([label]), h, c)
            g = decoder.joint.pred(out)
        np.testing.assert_allclose(prior, want, rtol=1e-5, atol=1e-6)
    assert decoder.label_prior([]) == []

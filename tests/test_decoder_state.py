"""The decoder state pool: the runner moves streams' rows only through gather, scatter and reset."""

from __future__ import annotations

import torch

from parakeet_stream.model.rnnt import DecoderState


def _rows(state: DecoderState) -> list[torch.Tensor]:
    return [state.h, state.c, state.g]


def _same(a: DecoderState, b: DecoderState) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_rows(a), _rows(b)))


def test_a_pool_starts_every_slot_at_the_start_and_reset_returns_to_it(eou_model):
    decoder = eou_model.decoder
    start = decoder.initial_state(1)
    pool = decoder.state_pool(4)
    assert all(_same(pool.gather(torch.tensor([i])), start) for i in range(4))
    slots = torch.tensor([1, 3])
    moved = DecoderState(*(torch.randn_like(t) for t in _rows(pool.gather(slots))))
    pool.scatter(slots, moved)
    assert _same(pool.gather(slots), moved)
    assert _same(pool.gather(torch.tensor([0])), start) and _same(pool.gather(torch.tensor([2])), start)
    pool.reset(torch.tensor([3]))
    assert _same(pool.gather(torch.tensor([3])), start)
    assert _same(pool.gather(torch.tensor([1])), moved.gather(torch.tensor([0])))


def test_decoding_from_a_gathered_state_equals_decoding_from_a_fresh_one(eou_model, wavs):
    model = eou_model
    with torch.inference_mode():
        feats, valid = model.features(torch.from_numpy(wavs["sentence"]))
        enc, lens = model.encoder(feats[None], torch.tensor([valid]))
        alone, _ = model.decoder.decode(enc, lens, model.decoder.initial_state(1))
        pool = model.decoder.state_pool(3)
        slot = torch.tensor([2])
        pooled, state = model.decoder.decode(enc, lens, pool.gather(slot))
        pool.scatter(slot, state)
    assert pooled.token == alone.token and alone.token
    assert _same(pool.gather(slot), state)

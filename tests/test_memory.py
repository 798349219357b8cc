"""GPU memory sizing (engine/memory.py) as arithmetic, and pre-encode batches split to the step size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from conftest import NEMO
from helpers import run_stream, tokens_of

from parakeet_stream.engine import ASREngine
from parakeet_stream.engine.chunker import FrontEnd, FrontEnds
from parakeet_stream.engine.inbox import Inbox
from parakeet_stream.engine.memory import MAX_BATCH, MAX_SLOTS, SHARE, DoesNotFit, plan_memory, slot_bytes
from parakeet_stream.engine.phrases import BEAM, LIMITS
from parakeet_stream.engine.pipeline import DEPTH
from parakeet_stream.model.beam import BeamPool
from parakeet_stream.model.boosting import BoostPool
from parakeet_stream.model.config import ModelConfig
from parakeet_stream.model.conformer import EncoderCache

GB, MB = 2**30, 2**20


def fits(plan, free, slot, stream) -> bool:
    return plan.slots * slot + DEPTH * plan.max_batch * stream <= SHARE * free


@pytest.mark.parametrize("free,slot,stream", [(75 * GB, 9 * MB, 40 * MB), (75 * GB, 2 * MB, 5 * MB),
                                              (8 * GB, 9 * MB, 200 * MB), (1 * GB, 50 * MB, 250 * MB)])
def test_auto_fills_the_memory_with_slots_and_leaves_room_for_the_steps(free, slot, stream):
    plan = plan_memory(free, slot, stream)
    assert fits(plan, free, slot, stream)
    assert 1 <= plan.max_batch <= min(MAX_BATCH, plan.slots) and plan.slots <= MAX_SLOTS
    assert DEPTH * plan.max_batch * stream <= SHARE * free / 2 or plan.max_batch == 1
    if plan.slots < MAX_SLOTS:  # one more slot would not fit
        assert plan.slots * slot + DEPTH * plan.max_batch * stream + slot > SHARE * free


def test_the_largest_step_is_capped_and_never_exceeds_the_slots():
    assert plan_memory(75 * GB, 9 * MB, 1 * MB).max_batch == MAX_BATCH
    assert plan_memory(75 * GB, 9 * MB, 1 * MB, max_batch=64).max_batch == 64
    assert plan_memory(75 * GB, 9 * MB, 1 * MB, slots=100).max_batch == 100


def test_given_slots_that_do_not_fit_are_refused_in_one_line():
    with pytest.raises(DoesNotFit, match="4000 streams do not fit"):
        plan_memory(8 * GB, 9 * MB, 40 * MB, slots=4000)
    plan = plan_memory(8 * GB, 9 * MB, 40 * MB, slots=500)
    assert fits(plan, 8 * GB, 9 * MB, 40 * MB) and plan.slots == 500


def test_the_old_sizing_of_the_issue_is_gone():
    """issue 29: 'auto' gave ~4,096 slots of `large` in float16 on 80 GB and a step over all of them."""
    cfg = ModelConfig.from_nemo(yaml.safe_load((NEMO / "large_model_config.yaml").read_text()))
    slot = EncoderCache.slot_bytes(cfg.encoder, torch.float16)
    plan = plan_memory(78 * GB, slot, 30 * MB)  # 30 MB: a pessimistic step share of one stream
    assert plan.max_batch <= MAX_BATCH < 4096 and fits(plan, 78 * GB, slot, 30 * MB)


def test_slot_bytes_is_what_the_pools_take_per_slot(nemotron_model):
    pools = [nemotron_model.decoder.state_pool(n) for n in (3, 5)]
    caches = [EncoderCache.zeros(nemotron_model.cfg.encoder, n) for n in (3, 5)]
    starts = np.zeros(nemotron_model.decoder.blank + 1, dtype=bool)
    boosts = [BoostPool(n, LIMITS, torch.device("cpu"), starts) for n in (3, 5)]
    beams = [BeamPool(nemotron_model.decoder, n, BEAM, torch.device("cpu")) for n in (3, 5)]

    def size(cache, state, boost, beam):
        tensors = (cache.keys, cache.values, cache.conv, state.h, state.c, state.g, boost.root, boost.nodes,
                   boost.arcs, beam.h, beam.c, beam.g, beam.score, beam.node, beam.banked, beam.last, beam.heard,
                   beam.loan, beam.hash, beam.eou, beam.greedy)
        return sum(t.numel() * t.element_size() for t in tensors)

    grown = size(caches[1], pools[1], boosts[1], beams[1]) - size(caches[0], pools[0], boosts[0], beams[0])
    assert grown // 2 + FrontEnds.slot_bytes(nemotron_model) == slot_bytes(nemotron_model)


def test_the_mel_frames_a_slot_keeps_fit_in_what_memory_counts_for_them(nemotron_model):
    """Steps that cut what their samples make ready, in every mode, from packets of any size: the
    rows a slot keeps between steps stay within FrontEnds.slot_bytes."""
    model, rng = nemotron_model, np.random.default_rng(3)
    for mode in model.cfg.encoder.att_context_sizes:
        spec, fcfg = model.encoder.chunk_spec(mode), model.cfg.features
        store, front, inbox = FrontEnds(model.features, 1), FrontEnd(model.features, spec), Inbox(spec, fcfg.hop_length, fcfg.n_fft)
        for packet in rng.integers(1, 8000, 12):
            inbox.add(rng.standard_normal(int(packet)).astype(np.float32))
            upto = inbox.samples_for(inbox.chunks_ready - 1) if inbox.chunks_ready else 0
            rows = store.lay_out([front], [0], *store.new_frames([front], [inbox.take_samples(upto)], [False]))
            store.cut([front], rows, [0], [9], [False])
            store.keep([front], [0], rows)
        assert 0 < store.carry[0].numel() * 4 <= FrontEnds.slot_bytes(model), mode


def test_pre_encode_batches_are_split_to_the_step_size(eou_model, wavs):
    audio = wavs["sentence"]
    with ASREngine(eou_model, max_num_streams=2) as whole:
        expected = tokens_of(run_stream(whole, audio, packet=len(audio)))  # one backlog: up to 8 chunks a step
    with ASREngine(eou_model, max_num_streams=2, max_batch=2) as engine:
        sizes, real = [], engine.model.encoder.stream_pre_encode

        def spy(feats, *args):
            sizes.append(feats.size(0))
            return real(feats, *args)

        engine.model.encoder.stream_pre_encode = spy
        try:
            assert tokens_of(run_stream(engine, audio, packet=len(audio))) == expected
        finally:
            del engine.model.encoder.stream_pre_encode
    assert max(sizes) == 2 and len(sizes) > 4

"""The decode stage's routing: one greedy RNN-T pass per batch (label looping, model/greedy.py) for
the streams without key phrases, their tokens to the host in one copy per round of the step (a
graph's bounded pass may leave a row unfinished: decoded again before its stream's next chunk); a
beam search (model/beam.py) with each stream's boosting tree (model/boosting.py) for those with
phrases, committed (beams.py) batch by batch.

It holds the decoder's pools, a row per slot (and the scratch slot that static batches' padding
rows write to): the decoder states, the boosting trees, the beams, and the host's commits.
"""

from __future__ import annotations

from itertools import groupby
from operator import attrgetter

import numpy as np
import torch

from ...model.beam import BeamPass, BeamPool
from ...model.boosting import BoostPool, word_starts
from ...model.config import Lookahead
from ...model.device import device_index, to_host
from ...model.greedy import GreedyPass, eou_probabilities, unfinished, unpack_scored
from ...model.parakeet import ParakeetModel
from ...model.rnnt import DecoderState
from .. import phrases
from ..step import Batch, Step, StepItem
from .beams import BeamCommits
from .cuda_graphs import StaticBatches
from .cuda_streams import StageStreams


class StepDecoder:
    def __init__(self, model: ParakeetModel, rows: int, cuda_streams: StageStreams,
                 greedy_static: dict[Lookahead, StaticBatches], beam_static: dict[Lookahead, StaticBatches]):
        """rows: the pools' rows (the slots, and the scratch slot with static batches); greedy_static,
        beam_static: the passes' static batches by mode (filled by the ModelRunner; empty: eager)."""
        self.model, self.cuda_streams = model, cuda_streams
        self.greedy_static, self.beam_static = greedy_static, beam_static
        self.device = model.features.fb.device
        self.eou = model.tokenizer.eou_id if model.tokenizer is not None else None
        decoder = model.decoder
        self.state = decoder.state_pool(rows, self.device)
        self.boost = BoostPool(rows, phrases.LIMITS, self.device, word_starts(model.tokenizer, decoder.blank + 1))
        self.beams = BeamPool(decoder, rows, phrases.BEAM, self.device)
        self.commits = BeamCommits(phrases.BEAM, max(1, round(phrases.MAX_LAG_SECONDS / model.frame_seconds)),
                                   phrases.COMMIT_MARGIN, self.eou)

    def decode(self, step: Step) -> None:
        """One pass per batch, so every chunk gets its own tokens, as NeMo's steps do: greedy for the
        streams without phrases, the beam search for those with."""
        first = [item for item in step if item.first and item.live]
        if first:
            self.state.reset(device_index([item.slot for item in first], self.device))
            for item in first:
                self.boost.load(item.slot, item.seq.boosting)
            self._start_beams(first)
            self.cuda_streams.mark(step, "decoder state reset", len(first))
        for _, batches in groupby(step.batches, key=attrgetter("round")):
            self._decode_round(step, list(batches))
        if self.commits.written:  # no loop over the step where no stream has phrases
            for item in step:
                if item.last and item.live and item.slot in self.commits:
                    item.final_tokens = self.commits.finish(item.slot)

    def _decode_round(self, step: Step, batches: list[Batch]) -> None:
        """One round's batches (a stream's chunk each), their labels on the host before the next
        round's: a row a bounded pass left unfinished is decoded again before its stream's next chunk."""
        passes, packed, plain = [], [], []
        for batch in batches:
            slots = [item.slot for item in batch.items]
            boosted = self.boost.has_phrases(slots)
            if not boosted.any():  # the common case: no row to split off, no per-row work
                passes.append((batch.mode, batch.encoded, batch.lengths, batch.slots))
                packed.append(self._decode_greedy(*passes[-1]))
                plain.append(batch.items)
                self.cuda_streams.mark(step, "greedy", len(batch.items), batch.mode)
                continue
            self._decode_beams(batch, np.flatnonzero(boosted), slots)
            if not boosted.all():
                rows = np.flatnonzero(~boosted)
                passes.append((batch.mode, *self._rows(batch, rows)))
                packed.append(self._decode_greedy(*passes[-1]))
                plain.append([batch.items[r] for r in rows])
            self.cuda_streams.mark(step, "greedy and beams", len(batch.items), batch.mode)
        for items, rows in zip(plain, self._finish(passes, to_host(packed, self.device))):
            for item, found, eou in zip(items, unpack_scored(rows), eou_probabilities(rows)):
                item.tokens.append(found)
                item.eou.append(eou)

    def _decode_greedy(self, mode: Lookahead, enc, lengths, slots) -> torch.Tensor:
        static = self.greedy_static.get(mode)
        if static:  # its static input is float32: the copy in casts
            return static(enc, lengths, slots)
        return self.greedy(enc.float(), lengths, slots)

    def _finish(self, passes: list[tuple], fetched: list[np.ndarray]) -> list[np.ndarray]:
        """Each greedy pass's labels on the host, the rows a bounded pass (static batches) left
        unfinished decoded again, eagerly from their state before it: a second wait in the step, only
        where a chunk had more labels than `fixed_iterations` allows for (model/greedy.py)."""
        redo = [(i, rows) for i, found in enumerate(fetched) if (rows := unfinished(found)).size]
        if redo:
            again = to_host([self._greedy_rows(passes[i], rows) for i, rows in redo], self.device)
            for (i, rows), found in zip(redo, again):
                fetched[i][rows] = found
        return fetched

    def _greedy_rows(self, batch_pass: tuple, rows: np.ndarray) -> torch.Tensor:
        _, enc, lengths, slots = batch_pass
        at = device_index(rows, self.device)
        return self.greedy(enc[at].float(), lengths[at], slots[at])

    def _decode_beams(self, batch: Batch, rows: np.ndarray, slots: list[int]) -> None:
        """The beam search of the batch's `rows`, committed at once (a hypothesis dropped there must
        be out of the beam before the stream's next chunk, which may be the step's next round)."""
        enc, lengths, at = self._rows(batch, rows)
        static = self.beam_static.get(batch.mode)
        if static:
            packed = static(enc, lengths, at)
        else:
            widths = tuple(self.boost.widths[[slots[r] for r in rows]].max(0).tolist())
            packed = self.beam(enc.float(), lengths, at, widths=widths)
        for r, beams in zip(rows, to_host([packed], self.device)[0]):
            item = batch.items[r]
            done = self.commits.take(item.slot, beams.reshape(self.beams.beam, -1), item.frames[len(item.tokens)])
            if done.drop:
                self.beams.drop(item.slot, done.drop)
            if done.lead is not None:
                self.beams.lead(item.slot, done.lead)
            item.tokens.append(done.labels)
            item.eou.append(done.eou)

    def _start_beams(self, first: list[StepItem]) -> None:
        slots = [item.slot for item in first if item.seq.boosting is not None]
        if slots:
            self.beams.reset(device_index(slots, self.device))
        for item in first:
            self.commits.start(item.slot, item.seq.boosting is not None)

    def _rows(self, batch: Batch, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        at = device_index(rows, self.device)
        return batch.encoded[at], batch.lengths[at], batch.slots[at]

    def greedy(self, enc, lengths, slots, fixed: bool = False) -> torch.Tensor:
        """The greedy pass of the streams at `slots`, their decoder state carried in the pool; labels
        with their probabilities (GreedyPass.scored). `fixed`: a bounded pass whose unfinished rows keep
        their state (`_finish` decodes them again)."""
        state = self.state.gather(slots)
        done = GreedyPass(self.model.decoder, enc, lengths, state, eou=self.eou).run(fixed)
        self.state.scatter(slots, DecoderState(*done.settled(state)))
        return done.scored()

    def beam(self, enc, lengths, slots, fixed: bool = False, widths: tuple[int, int] | None = None) -> torch.Tensor:
        """The beam search of the streams at `slots`, their beams carried in the pool (BeamPass.packed):
        eagerly at the batch's boosting `widths`, or (`fixed`) in fixed shapes."""
        search = BeamPass(self.model.decoder, enc, lengths, self.beams.gather(slots), self.boost, slots,
                          phrases.SYMBOLS, self.eou, widths)
        search.run(fixed=fixed)
        self.beams.scatter(slots, search.hyps)
        return search.packed().flatten(1)

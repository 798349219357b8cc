"""The ModelRunner: the model and its state pools; it runs a step's stages and nothing else.

pre-encode: features and subsampling of every chunk in the step, one batch per lookahead mode,
  cut into the step's batches (one per round and mode, step.py);
encode: the cache-aware encoder layers over each batch, against the slot pool, then (a multilingual
  model) each row's language prompt, gathered by its slot from the prompt pool;
decode: one greedy RNN-T pass per batch (label looping, model/greedy.py) for the streams without
  key phrases, their tokens to the host in one copy per round of the step (a graph's bounded pass
  may leave a row unfinished: decoded again before its stream's next chunk); a beam search
  (model/beam.py) with each stream's boosting tree (model/boosting.py) for those with phrases,
  committed (beams.py) batch by batch.
As nano-vllm's ModelRunner.run, it decides nothing (the Scheduler chose the step) and delivers
nothing (the engine turns tokens into results and publishes them). On CUDA each stage runs on
its own stream (cuda_streams.py), the encoder layers and the greedy pass replay CUDA graphs captured
at start-up (cuda_graphs.py), and the host never waits for the device but for a round's tokens.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from contextlib import nullcontext
from functools import partial
from itertools import groupby
from operator import attrgetter

import numpy as np
import torch

from ...model.device import to_device
from ...model.beam import BeamPass, BeamPool
from ...model.boosting import BoostPool, word_starts
from ...model.config import Lookahead
from ...model.conformer import EncoderCache
from ...model.greedy import GreedyPass, eou_probabilities, unfinished, unpack_scored
from ...model.parakeet import ParakeetModel
from ...model.rnnt import DecoderState
from .. import chunker, phrases
from ..inbox import take_step_samples
from ..step import Batch, Step, StepItem
from .beams import BeamCommits
from .cuda_graphs import StaticBatches, graph_sizes
from .cuda_streams import StageStreams

log = logging.getLogger(__name__)

STAGES = ["pre-encode", "encode", "decode"]


class ModelRunner:
    def __init__(self, model: ParakeetModel, slots: int, max_batch: int, graphs: bool | None = None,
                 main_mode: Lookahead | None = None, modes: list[Lookahead] | None = None):
        """graphs: replay the encoder and the decoder from static batches (default: on CUDA, as CUDA
        graphs; True on CPU runs their eager stand-in, to test the bookkeeping); main_mode: the
        lookahead most streams use (the server's default), whose batches get the finest sizes;
        modes: those served, the only ones with static batches (default: every mode of the model)."""
        self.model = model
        self.main_mode = main_mode or model.cfg.default_lookahead
        self.modes = modes or list(model.cfg.encoder.att_context_sizes)
        self.device = model.features.fb.device
        self.slots, self.max_batch = slots, max_batch
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.eou = model.tokenizer.eou_id if model.tokenizer is not None else None
        self.cache, self.decoder_state, self.boost, self.beams = self.allocate_pools(slots)
        self.commits = BeamCommits(phrases.BEAM, max(1, round(phrases.MAX_LAG_SECONDS / model.frame_seconds)),
                                   phrases.COMMIT_MARGIN, self.eou)
        self.prompts = self._prompt_pool(slots)
        self.fronts = chunker.FrontEnds(model.features, slots)
        self._frames_by_end: dict[Lookahead, np.ndarray] = {}
        self.cuda_streams = StageStreams(self.device, STAGES)
        self.keep_samples = False  # hand diarized streams' samples on to the diarize stage (engine/diarizer.py)
        self.pre_encoders: dict[Lookahead, StaticBatches] = {}
        self.encoders: dict[Lookahead, StaticBatches] = {}
        self.decoders: dict[Lookahead, StaticBatches] = {}
        self.beam_decoders: dict[Lookahead, StaticBatches] = {}  # the streams with phrases
        if self.graphs:
            self._static_batches()

    def allocate_pools(self, slots: int) -> tuple[EncoderCache, DecoderState, BoostPool, BeamPool]:
        """Encoder caches, decoder states, boosting trees and beams of every slot, allocated once as
        [layers, slots, ...] (with static batches one more: the scratch slot, index `slots`, that
        padding rows write to)."""
        rows = slots + (1 if self.graphs else 0)
        decoder = self.model.decoder
        cache = EncoderCache.zeros(self.model.cfg.encoder, rows, self.device, self.model.encoder_dtype)
        starts = word_starts(self.model.tokenizer, decoder.blank + 1)
        boost = BoostPool(rows, phrases.LIMITS, self.device, starts)
        return cache, decoder.state_pool(rows, self.device), boost, BeamPool(decoder, rows, phrases.BEAM, self.device)

    def _prompt_pool(self, slots: int) -> torch.Tensor | None:
        """Each slot's language prompt index (the scratch slot's too); None: a model without prompts."""
        if self.model.prompt is None:
            return None
        return torch.zeros(slots + (1 if self.graphs else 0), dtype=torch.long, device=self.device)

    @property
    def static_batches(self) -> list[StaticBatches]:
        return [*self.pre_encoders.values(), *self.encoders.values(), *self.decoders.values(),
                *self.beam_decoders.values()]

    def capture(self) -> None:
        """Capture every CUDA graph (every mode, every size), before the stage threads start."""
        with torch.inference_mode(), _on(self.device):
            for static in self.static_batches:
                static.capture()
        if self.graphs:
            log.info("captured %d graphs in %.1f s: %s", self.graph_count, sum(s.capture_seconds for s in self.static_batches),
                     ", ".join(f"{s.name} {len(s.sizes)} in {s.capture_seconds:.1f} s" for s in self.static_batches))

    @property
    def graph_count(self) -> int:
        return sum(len(s.sizes) for s in self.static_batches) if self.graphs else 0

    # --- stages ----------------------------------------------------------------------------
    def pre_encode(self, step: Step) -> None:
        live = [item for item in step if item.live]
        samples = take_step_samples([item.seq.inbox for item in live], [item.samples_upto for item in live])
        if self.keep_samples:
            step.diarized = [(item, new) for item, new in zip(live, samples) if item.seq.diarize]
        step.batches = sorted(self._pre_encoded(step, live, samples) if live else [], key=attrgetter("round"))
        self.cuda_streams.hand_on(step, "encode")

    def _pre_encoded(self, step: Step, live: list[StepItem], samples: list[np.ndarray]) -> list[Batch]:
        """The step's batches: every stream's new frames at once, then each mode's chunks cut and
        pre-encoded at once, split into rounds; each stream's timeline kept for its next step."""
        fronts, slots, last = [i.seq.front for i in live], [i.slot for i in live], [i.last for i in live]
        self.fronts.start([item.slot for item in live if item.first])
        rows = self.fronts.lay_out(fronts, slots, *self.fronts.new_frames(fronts, samples, last))
        by_mode: dict = defaultdict(list)
        for k, item in enumerate(live):
            by_mode[item.seq.lookahead].append(k)
        batches = []
        for mode, members in by_mode.items():
            windows = self.fronts.cut(fronts, rows, members, [live[k].chunks for k in members], [last[k] for k in members])
            if windows is None:
                continue
            x = self._subsample(mode, windows)
            self.cuda_streams.mark(step, "pre-encode", len(windows.owner), mode)
            items = [live[k] for k in windows.owner.tolist()]
            bounds = [0, *(np.flatnonzero(np.diff(windows.round)) + 1).tolist(), len(items)]
            slots_at = rows.slots[windows.owner]
            batches += [self._batch(mode, items[a:b], windows, slots_at, a, b, x[a:b]) for a, b in zip(bounds, bounds[1:])]
        self.fronts.keep(fronts, slots, rows)
        return batches

    def encode(self, step: Step) -> None:
        self.cuda_streams.follow(step)
        first = [item for item in step if item.first and item.live]
        if first:
            slots = self._index([item.slot for item in first])
            self.cache.reset(slots)
            if self.prompts is not None:  # in place: the captured graphs read the pool
                self.prompts[slots] = self._index([item.seq.prompt for item in first])
            self.cuda_streams.mark(step, "encoder cache reset", len(first))
        for batch in step.batches:
            static = self.encoders.get(batch.mode)
            args = (batch.x, batch.lengths, batch.slots)
            batch.encoded = static(*args) if static else self._layers(*args, mode=batch.mode)
            self.cuda_streams.mark(step, "encode", len(batch.items), batch.mode)
        self.cuda_streams.hand_on(step, "decode")

    def decode(self, step: Step) -> None:
        """One pass per batch, so every chunk gets its own tokens, as NeMo's steps do: greedy for the
        streams without phrases, the beam search for those with."""
        self.cuda_streams.follow(step)
        first = [item for item in step if item.first and item.live]
        if first:
            self.decoder_state.reset(self._index([item.slot for item in first]))
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
        for items, rows in zip(plain, self._finish(passes, self._fetch(packed))):
            for item, found, eou in zip(items, unpack_scored(rows), eou_probabilities(rows)):
                item.tokens.append(found)
                item.eou.append(eou)

    def _decode_greedy(self, mode: Lookahead, enc, lengths, slots) -> torch.Tensor:
        static = self.decoders.get(mode)
        if static:  # its static input is float32: the copy in casts
            return static(enc, lengths, slots)
        return self._greedy(enc.float(), lengths, slots)

    def _finish(self, passes: list[tuple], fetched: list[np.ndarray]) -> list[np.ndarray]:
        """Each greedy pass's labels on the host, the rows a bounded pass (static batches) left
        unfinished decoded again, eagerly from their state before it: a second wait in the step, only
        where a chunk had more labels than `fixed_iterations` allows for (model/greedy.py)."""
        redo = [(i, rows) for i, found in enumerate(fetched) if (rows := unfinished(found)).size]
        if redo:
            again = self._fetch([self._greedy_rows(passes[i], rows) for i, rows in redo])
            for (i, rows), found in zip(redo, again):
                fetched[i][rows] = found
        return fetched

    def _greedy_rows(self, batch_pass: tuple, rows: np.ndarray) -> torch.Tensor:
        _, enc, lengths, slots = batch_pass
        at = self._index(rows.tolist())
        return self._greedy(enc[at].float(), lengths[at], slots[at])

    def _decode_beams(self, batch: Batch, rows: np.ndarray, slots: list[int]) -> None:
        """The beam search of the batch's `rows`, committed at once (a hypothesis dropped there must
        be out of the beam before the stream's next chunk, which may be the step's next round)."""
        enc, lengths, at = self._rows(batch, rows)
        static = self.beam_decoders.get(batch.mode)
        if static:
            packed = static(enc, lengths, at)
        else:
            widths = tuple(self.boost.widths[[slots[r] for r in rows]].max(0).tolist())
            packed = self._beam(enc.float(), lengths, at, widths=widths)
        for r, beams in zip(rows, self._fetch([packed])[0]):
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
            self.beams.reset(self._index(slots))
        for item in first:
            self.commits.start(item.slot, item.seq.boosting is not None)

    def _rows(self, batch: Batch, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        at = self._index(rows.tolist())
        return batch.encoded[at], batch.lengths[at], batch.slots[at]

    # --- internals ---------------------------------------------------------------------------
    def _subsample(self, mode: Lookahead, windows: chunker.Windows) -> torch.Tensor:
        """Pre-encode of every window of one mode, at most max_batch windows per call (memory)."""
        feats = windows.frames.to(self.model.encoder_dtype)
        lengths, start = self._index(windows.length), self._index(windows.start)
        run = self.pre_encoders.get(mode) or partial(self._pre_encode, mode=mode)
        parts = [run(feats[i : i + self.max_batch], lengths[i : i + self.max_batch], start[i : i + self.max_batch])
                 for i in range(0, feats.size(0), self.max_batch)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _batch(self, mode: Lookahead, items: list[StepItem], windows: chunker.Windows, slots: np.ndarray, a: int,
               b: int, x: torch.Tensor) -> Batch:
        """Rows a..b of a mode's windows (one round; `slots`: each window's): a batch for the encoder
        and the decoder."""
        frames = self._valid_frames(mode)[windows.start[a:b] + windows.length[a:b]]
        for item, n in zip(items, frames.tolist()):
            item.frames.append(n)
        return Batch(mode, items, x, self._index(frames), self._index(slots[a:b]), round=int(windows.round[a]))

    def _valid_frames(self, mode: Lookahead) -> np.ndarray:
        """The encoder frames a window gives by where its valid mel frames end (0 to the window)."""
        table = self._frames_by_end.get(mode)
        if table is None:
            stream_frames, window = self.model.encoder.stream_frames, self.model.encoder.chunk_spec(mode).window
            table = self._frames_by_end[mode] = np.array([stream_frames(0, end, mode) for end in range(window + 1)])
        return table

    def _pre_encode(self, feats, lengths, start, mode: Lookahead, fixed: bool = False) -> torch.Tensor:
        return self.model.encoder.stream_pre_encode(feats, lengths, start, mode)[0]

    def _layers(self, x, lengths, slots, mode: Lookahead, fixed: bool = False) -> torch.Tensor:
        enc = self.model.encoder.stream_layers(x, lengths, self.cache, slots, mode)
        if self.prompts is None:
            return enc
        # float32, as the joint that reads it: the prompt kernel keeps its weights' precision
        return self.model.prompted(enc.float(), self.prompts[slots])

    def _greedy(self, enc, lengths, slots, fixed: bool = False) -> torch.Tensor:
        """The greedy pass of the streams at `slots`, their decoder state carried in the pool; labels
        with their probabilities (GreedyPass.scored). `fixed`: a bounded pass whose unfinished rows keep
        their state (`_finish` decodes them again)."""
        state = self.decoder_state.gather(slots)
        done = GreedyPass(self.model.decoder, enc, lengths, state, eou=self.eou).run(fixed)
        self.decoder_state.scatter(slots, DecoderState(*done.settled(state)))
        return done.scored()

    def _beam(self, enc, lengths, slots, fixed: bool = False, widths: tuple[int, int] | None = None) -> torch.Tensor:
        """The beam search of the streams at `slots`, their beams carried in the pool (BeamPass.packed):
        eagerly at the batch's boosting `widths`, or (`fixed`) in fixed shapes."""
        search = BeamPass(self.model.decoder, enc, lengths, self.beams.gather(slots), self.boost, slots,
                          phrases.SYMBOLS, self.eou, widths)
        search.run(fixed=fixed)
        self.beams.scatter(slots, search.hyps)
        return search.packed().flatten(1)

    def _static_batches(self) -> None:
        """Pre-encode, the encoder layers and the greedy pass of every mode as static batches; the graphs of each
        stage are captured on its stream and share one memory pool (a stage's replays never overlap: they run
        on its one stream; cuda_graphs.py says why the stream matters)."""
        cuda = self.device.type == "cuda"
        lanes = {stage: {"pool": torch.cuda.graph_pool_handle(), "stream": self.cuda_streams.stream(stage)} if cuda else {}
                 for stage in STAGES}
        d, scratch, n_mels = self.model.cfg.encoder.d_model, self.slots, self.model.cfg.features.n_mels
        # Fine sizes for the plain batches of the main mode (most streams); the other modes' batches and
        # those with key phrases (the few) pad to powers of two: a third of the graphs to capture.
        # Pre-encode is a small share of a step but its capture the dearest (cuDNN makes a plan per
        # shape, 0.35 s each on an H200): powers of four.
        fine, coarse = graph_sizes(self.max_batch), graph_sizes(self.max_batch, dense=self.max_batch)
        quarter = [s for s in coarse if s.bit_length() % 2 == 1 or s == self.max_batch]
        for mode in self.modes:
            sizes = fine if mode == self.main_mode else coarse
            spec = self.model.encoder.chunk_spec(mode)
            frames = spec.out_frames

            def windows(n: int, window=spec.window):
                rows = torch.zeros(n, dtype=torch.long, device=self.device)
                return torch.zeros(n, window, n_mels, device=self.device, dtype=self.model.encoder_dtype), rows, rows.clone()

            # pre-encode's rows are independent: padding rows are zero frames, every one valid
            self.pre_encoders[mode] = StaticBatches(f"pre-encode {mode}", partial(self._pre_encode, mode=mode), windows,
                                                    (None, spec.window, 0), self.max_batch, cuda, sizes=quarter,
                                                    **lanes["pre-encode"])

            def inputs(n: int, dtype: torch.dtype, frames=frames):
                rows = torch.zeros(n, dtype=torch.long, device=self.device)
                return torch.zeros(n, frames, d, device=self.device, dtype=dtype), rows, rows.clone()

            padding = (None, 0, scratch)  # padding rows: no valid frame, the scratch slot
            self.encoders[mode] = StaticBatches(f"encode {mode}", partial(self._layers, mode=mode),
                                                partial(inputs, dtype=self.model.encoder_dtype), padding,
                                                self.max_batch, cuda, sizes=sizes, **lanes["encode"])
            self.decoders[mode] = StaticBatches(f"decode {mode}", self._greedy, partial(inputs, dtype=torch.float32),
                                                padding, self.max_batch, cuda, sizes=sizes, **lanes["decode"])
            self.beam_decoders[mode] = StaticBatches(f"decode+phrases {mode}", self._beam,
                                                        partial(inputs, dtype=torch.float32), padding,
                                                        self.max_batch, cuda, sizes=coarse, **lanes["decode"])

    def _index(self, values: list[int] | np.ndarray) -> torch.Tensor:
        """Host integers on the device, without a blocking copy."""
        return to_device(torch.as_tensor(np.asarray(values, np.int64)), self.device)

    def _fetch(self, packed: list[torch.Tensor]) -> list[np.ndarray]:
        """Every batch's packed labels on the host: one copy and one wait for the whole step."""
        if not packed:
            return []
        flat = torch.cat([p.flatten() for p in packed])
        if self.device.type == "cuda":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            copied = torch.cuda.Event(blocking=True)  # the thread sleeps while the step runs (CUDA would spin a core)
            copied.record()
            copied.synchronize()
            flat = host
        parts = np.split(flat.numpy(), np.cumsum([p.numel() for p in packed])[:-1])
        return [part.reshape(p.shape) for part, p in zip(parts, packed)]


def _on(device: torch.device):
    """The device as CUDA's current one (what the graphs capture on); nothing on CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()

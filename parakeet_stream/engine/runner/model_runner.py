"""The ModelRunner: the model and its state pools; it runs a step's stages and nothing else.

pre-encode: features and subsampling of every chunk in the step, one batch per lookahead mode,
  cut into the step's batches (pre_encoder.py);
encode: the cache-aware encoder layers over each batch, against the slot pool, then (a multilingual
  model) each row's language prompt, gathered by its slot from the prompt pool;
decode: greedy passes and, for streams with key phrases, beam searches (step_decoder.py).
As nano-vllm's ModelRunner.run, it decides nothing (the Scheduler chose the step) and delivers
nothing (the engine turns tokens into results and publishes them). On CUDA each stage runs on
its own stream (cuda_streams.py), the encoder layers and the greedy pass replay CUDA graphs captured
at start-up (cuda_graphs.py), and the host never waits for the device but for a round's tokens.
"""

from __future__ import annotations

import logging
from functools import partial
from operator import attrgetter

import torch

from ...model.config import Lookahead
from ...model.conformer import EncoderCache
from ...model.device import device_index
from ...model.parakeet import ParakeetModel
from ..inbox import take_step_samples
from ..step import Step
from .cuda_graphs import StaticBatches, graph_sizes, on_device
from .cuda_streams import StageStreams
from .pre_encoder import PreEncoder
from .step_decoder import StepDecoder

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
        rows = slots + (1 if self.graphs else 0)  # static batches' padding rows write to a scratch slot
        self.cache = EncoderCache.zeros(model.cfg.encoder, rows, self.device, model.encoder_dtype)
        # each slot's language prompt index; None: a model without prompts
        self.prompts = torch.zeros(rows, dtype=torch.long, device=self.device) if model.prompt is not None else None
        self.cuda_streams = StageStreams(self.device, STAGES)
        self.keep_samples = False  # hand diarized streams' samples on to the diarize stage (engine/diarizer.py)
        self.pre_encoders: dict[Lookahead, StaticBatches] = {}
        self.encoders: dict[Lookahead, StaticBatches] = {}
        self.decoders: dict[Lookahead, StaticBatches] = {}
        self.beam_decoders: dict[Lookahead, StaticBatches] = {}  # the streams with phrases
        self.lanes: dict[str, dict] = {}  # CUDA: each stage's graph memory pool and stream
        self.pre_encoder = PreEncoder(model, slots, max_batch, self.cuda_streams, self.pre_encoders)
        self.step_decoder = StepDecoder(model, rows, self.cuda_streams, self.decoders, self.beam_decoders)
        decoding = self.step_decoder
        self.eou, self.decoder_state, self.boost, self.beams = decoding.eou, decoding.state, decoding.boost, decoding.beams
        if self.graphs:
            self._static_batches()

    @property
    def static_batches(self) -> list[StaticBatches]:
        return [*self.pre_encoders.values(), *self.encoders.values(), *self.decoders.values(),
                *self.beam_decoders.values()]

    def capture(self) -> None:
        """Capture every CUDA graph (every mode, every size), before the stage threads start."""
        with torch.inference_mode(), on_device(self.device):
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
        step.batches = sorted(self.pre_encoder.batches(step, live, samples) if live else [], key=attrgetter("round"))
        self.cuda_streams.hand_on(step, "encode")

    def encode(self, step: Step) -> None:
        self.cuda_streams.follow(step)
        first = [item for item in step if item.first and item.live]
        if first:
            slots = device_index([item.slot for item in first], self.device)
            self.cache.reset(slots)
            if self.prompts is not None:  # in place: the captured graphs read the pool
                self.prompts[slots] = device_index([item.seq.prompt for item in first], self.device)
            self.cuda_streams.mark(step, "encoder cache reset", len(first))
        for batch in step.batches:
            static = self.encoders.get(batch.mode)
            args = (batch.x, batch.lengths, batch.slots)
            batch.encoded = static(*args) if static else self._layers(*args, mode=batch.mode)
            self.cuda_streams.mark(step, "encode", len(batch.items), batch.mode)
        self.cuda_streams.hand_on(step, "decode")

    def decode(self, step: Step) -> None:
        self.cuda_streams.follow(step)
        self.step_decoder.decode(step)

    def _layers(self, x, lengths, slots, mode: Lookahead, fixed: bool = False) -> torch.Tensor:
        enc = self.model.encoder.stream_layers(x, lengths, self.cache, slots, mode)
        if self.prompts is None:
            return enc
        # float32, as the joint that reads it: the prompt kernel keeps its weights' precision
        return self.model.prompted(enc.float(), self.prompts[slots])

    def _static_batches(self) -> None:
        """Pre-encode, the encoder layers and the greedy pass of every mode as static batches; the graphs of each
        stage are captured on its stream and share one memory pool (a stage's replays never overlap: they run
        on its one stream; cuda_graphs.py says why the stream matters)."""
        cuda = self.device.type == "cuda"
        lanes = self.lanes = {stage: {"pool": torch.cuda.graph_pool_handle(), "stream": self.cuda_streams.stream(stage)}
                              if cuda else {} for stage in STAGES}
        d, scratch, n_mels = self.model.cfg.encoder.d_model, self.slots, self.model.cfg.features.n_mels
        # Fine sizes for the plain batches of the main mode (most streams); the other modes' batches and
        # those with key phrases (the few) pad to powers of two: a third of the graphs to capture.
        # Pre-encode is a small share of a step but its capture the dearest (cuDNN makes a plan per
        # shape, 0.35 s each on an H200): powers of four.
        fine, coarse = graph_sizes(self.max_batch), graph_sizes(self.max_batch, dense=self.max_batch)
        quarter = [s for s in coarse if s.bit_length() % 2 == 1 or s == self.max_batch]
        decoding = self.step_decoder
        for mode in self.modes:
            sizes = fine if mode == self.main_mode else coarse
            spec = self.model.encoder.chunk_spec(mode)
            frames = spec.out_frames

            def windows(n: int, window=spec.window):
                rows = torch.zeros(n, dtype=torch.long, device=self.device)
                return torch.zeros(n, window, n_mels, device=self.device, dtype=self.model.encoder_dtype), rows, rows.clone()

            # pre-encode's rows are independent: padding rows are zero frames, every one valid
            self.pre_encoders[mode] = StaticBatches(f"pre-encode {mode}", partial(self.pre_encoder.run_model, mode=mode),
                                                    windows, (None, spec.window, 0), self.max_batch, cuda, sizes=quarter,
                                                    **lanes["pre-encode"])

            def inputs(n: int, dtype: torch.dtype, frames=frames):
                rows = torch.zeros(n, dtype=torch.long, device=self.device)
                return torch.zeros(n, frames, d, device=self.device, dtype=dtype), rows, rows.clone()

            padding = (None, 0, scratch)  # padding rows: no valid frame, the scratch slot
            self.encoders[mode] = StaticBatches(f"encode {mode}", partial(self._layers, mode=mode),
                                                partial(inputs, dtype=self.model.encoder_dtype), padding,
                                                self.max_batch, cuda, sizes=sizes, **lanes["encode"])
            self.decoders[mode] = StaticBatches(f"decode {mode}", decoding.greedy, partial(inputs, dtype=torch.float32),
                                                padding, self.max_batch, cuda, sizes=sizes, **lanes["decode"])
            self.beam_decoders[mode] = StaticBatches(f"decode+phrases {mode}", decoding.beam,
                                                     partial(inputs, dtype=torch.float32), padding,
                                                     self.max_batch, cuda, sizes=coarse, **lanes["decode"])

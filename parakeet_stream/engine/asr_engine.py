"""ASREngine: the public API over Scheduler and ModelRunner, used by the server, CLIs and tests."""

from __future__ import annotations

import argparse
import itertools
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..audio import check_samples
from ..model.config import Lookahead, parse_lookahead
from ..model.features import FeatureStream
from ..host import available_ram, usable_cores
from ..model.loading import load_model
from ..model.parakeet import ParakeetModel
from ..model.precision import DTYPES, QUANTIZE, check_precision, parse_dtype, set_precision
from ..model.tokenizer import IncrementalDetokenizer
from .info import EngineInfo
from .model_runner import ModelRunner
from .scheduler import EngineError, QueueFull, Scheduler
from .results import StreamResult
from .sequence import Sequence, Status


def auto_num_streams(model: ParakeetModel, device: torch.device, dtype: torch.dtype, cap: int = 4096) -> int:
    """Slots that fit in half the free memory of the device (CPU: available RAM), at most `cap`."""
    enc = model.cfg.encoder
    frames = max(left for left, _ in enc.att_context_sizes) + max(right + 1 for _, right in enc.att_context_sizes)
    per_slot = enc.n_layers * enc.d_model * (2 * frames + enc.conv_kernel_size - 1) * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = available_ram() or 1 << 30
    return max(1, min(cap, int(free * 0.5) // max(per_slot, 1)))


def add_engine_arguments(ap) -> None:
    """The engine's speed options, shared by parakeet-serve, parakeet-transcribe and the benchmarks."""
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES),
                    help="encoder precision (default float32: token-exact with NeMo; bfloat16 pays on CPUs with avx512_bf16/AMX)")
    ap.add_argument("--quantize", default=None, choices=QUANTIZE, help="dynamic int8 encoder matmuls (CPU only)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads per model stage on CPU (default: usable cores)")
    ap.add_argument("--lookahead", "--att-context-size", type=_lookahead, default=None,
                    help="default lookahead mode L,R (attention context frames), e.g. 70,1 (default: the model's first)")
    ap.add_argument("--latency-budget", type=float, default=None,
                    help="seconds a chunk may take from its last sample to its result; steps are batched within it "
                         "(default: two chunks)")


def engine_options(args) -> dict:
    return {"dtype": args.dtype, "quantize": args.quantize, "threads": args.threads, "latency_budget": args.latency_budget,
            "lookahead": args.lookahead}


def _lookahead(text: str) -> Lookahead:
    try:
        return parse_lookahead(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None


class ASREngine:
    sample_rate = 16000

    def __init__(
        self,
        model: str | Path | ParakeetModel = "demo",
        device: str = "cpu",
        max_num_streams: int | str = 64,
        max_queue: int = 256,
        lookahead: Lookahead | None = None,
        endpoint_seconds: float = 0.8,
        dtype: str | torch.dtype = torch.float32,
        quantize: str | None = None,
        max_batch: int | None = None,
        latency_budget: float | None = None,
        threads: int | None = None,
    ):
        self.device = torch.device(device)
        check_precision(self.device, parse_dtype(dtype), quantize)  # before any weights move
        if not isinstance(model, ParakeetModel):
            model = load_model(model, self.device)
        self.model = set_precision(model, dtype, quantize)
        self.default_lookahead = self._check_lookahead(lookahead or model.cfg.default_lookahead)
        if max_num_streams == "auto":
            max_num_streams = auto_num_streams(model, self.device, model.encoder_dtype)
        if latency_budget is None:  # two chunks: a chunk may wait for others to share its step
            latency_budget = 2 * min(self.chunk_seconds(m) for m in self.lookahead_modes)
        self.scheduler = Scheduler(int(max_num_streams), max_queue, latency_budget, self.sample_rate, max_batch,
                                   max_in_flight=2)
        self.runner = ModelRunner(model, self.scheduler, self._notify_all, endpoint_seconds, threads or usable_cores())
        self._seqs: dict[int, Sequence] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._audio_seconds = 0.0
        self._started = False
        self.info = EngineInfo(
            sample_rate=self.sample_rate,
            frame_seconds=model.frame_seconds,
            tokenizer=model.tokenizer,
            lookahead_modes=tuple(self.lookahead_modes),
            default_lookahead=self.default_lookahead,
            chunk_seconds={mode: self.chunk_seconds(mode) for mode in self.lookahead_modes},
        )

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> "ASREngine":
        if not self._started:
            self.runner.start()
            self._started = True
        return self

    def shutdown(self) -> None:
        if self._started:
            self.runner.stop()
            self._started = False

    def __enter__(self) -> "ASREngine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # --- model facts ------------------------------------------------------------------------
    @property
    def lookahead_modes(self) -> list[Lookahead]:
        return list(self.model.cfg.encoder.att_context_sizes)

    def chunk_seconds(self, lookahead: Lookahead | None = None) -> float:
        spec = self.model.encoder.chunk_spec(self._check_lookahead(lookahead or self.default_lookahead))
        return spec.chunk_frames * self.model.cfg.features.hop_length / self.sample_rate

    def _check_lookahead(self, lookahead) -> Lookahead:
        try:
            return self.model.encoder.check_lookahead(lookahead)
        except (ValueError, TypeError, IndexError) as exc:
            raise EngineError("bad_lookahead", str(exc)) from None

    # --- streams --------------------------------------------------------------------------
    def create_stream(self, lookahead: Lookahead | None = None) -> int:
        mode = self._check_lookahead(lookahead) if lookahead is not None else self.default_lookahead
        sid = next(self._ids)
        fcfg = self.model.cfg.features
        seq = Sequence(
            stream_id=sid,
            lookahead=mode,
            spec=self.model.encoder.chunk_spec(mode),
            frames=FeatureStream(self.model.features),
            detok=IncrementalDetokenizer(self.model.tokenizer),
            n_mels=fcfg.n_mels,
            hop=fcfg.hop_length,
            n_fft=fcfg.n_fft,
        )
        with self._lock:
            self._seqs[sid] = seq
        try:
            self.scheduler.add(seq)
        except QueueFull:
            with self._lock:
                del self._seqs[sid]
            raise
        return sid

    def queue_position(self, sid: int) -> int:
        return self.scheduler.position(self._seq(sid))

    def push_audio(self, sid: int, samples) -> None:
        seq = self._seq(sid)
        if seq.status is Status.FAILED:
            raise EngineError("inference_error", "the stream failed")
        if seq.final_at is not None or seq.status in (Status.CANCELLED, Status.FINISHED):
            raise EngineError("stream_closed", "audio after the end of the stream")
        samples = check_samples(np.asarray(samples, dtype=np.float32))
        if samples.size:
            completed = seq.add_samples(samples)
            with self._lock:
                self._audio_seconds += samples.size / self.sample_rate
            if completed:  # a push that completes no chunk changes no scheduling decision
                self.scheduler.chunk_completed()

    def finalize(self, sid: int) -> None:
        self.scheduler.finish(self._seq(sid))

    def cancel(self, sid: int) -> None:
        with self._lock:
            seq = self._seqs.pop(sid, None)
        if seq is not None:
            self._notify_all(self.scheduler.cancel(seq))

    def collect(self, sid: int) -> list[StreamResult]:
        with self._lock:
            seq = self._seqs.get(sid)
        if seq is None:
            return []
        results = seq.take_results()
        if any(r.is_final for r in results):
            with self._lock:
                self._seqs.pop(sid, None)
        return results

    def add_listener(self, sid: int, callback: Callable[[], None]) -> None:
        seq = self._seq(sid)
        with seq.lock:
            seq.listeners.append(callback)

    def wait_for_update(self, sid: int, timeout: float | None = None) -> bool:
        """Block until the stream has results or its queue position changed (True), or timeout."""
        seq = self._seq(sid)
        event = threading.Event()
        with seq.lock:
            if seq.results:
                return True
            seq.listeners.append(event.set)
        try:
            return event.wait(timeout)
        finally:
            with seq.lock:
                seq.listeners.remove(event.set)

    def healthy(self) -> bool:
        """The stage threads are running (False once one has died or the engine stopped)."""
        return self._started and self.runner.alive()

    def stats(self) -> dict:
        out = self.scheduler.stats()
        with self._lock:
            out["audio_seconds"] = self._audio_seconds
        return out

    # --- internals ------------------------------------------------------------------------
    def _seq(self, sid: int) -> Sequence:
        with self._lock:
            seq = self._seqs.get(sid)
        if seq is None:
            raise EngineError("unknown_stream", f"no stream {sid}")
        return seq

    @staticmethod
    def _notify_all(seqs) -> None:
        for s in seqs:
            s.notify()

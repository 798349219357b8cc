"""ASREngine: the public API over Scheduler and ModelRunner, used by the server, CLIs and tests."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..audio import check_samples
from ..config import Lookahead
from ..features import FeatureStream
from ..model import ParakeetModel
from ..tokenizer import IncrementalDetokenizer
from .model_runner import ModelRunner
from .scheduler import QueueFullError, Scheduler
from .sequence import Sequence, Status, StreamResult


class EngineError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class QueueFull(EngineError):
    def __init__(self, message: str = "all slots are busy and the waiting queue is full"):
        super().__init__("queue_full", message)


def auto_num_streams(model: ParakeetModel, device: torch.device, dtype: torch.dtype, cap: int = 4096) -> int:
    """Slots that fit in half the free memory of the device (CPU: available RAM), at most `cap`."""
    enc = model.cfg.encoder
    c = max(left for left, _ in enc.att_context_sizes)
    per_slot = enc.n_layers * enc.d_model * (2 * c + enc.conv_kernel_size - 1) * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        free = _available_ram()
    return max(1, min(cap, int(free * 0.5) // max(per_slot, 1)))


def _available_ram() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 30


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
        dtype: torch.dtype = torch.float32,
        max_batch: int | None = None,
        batch_wait: float | None = None,
    ):
        self.device = torch.device(device)
        if not isinstance(model, ParakeetModel):
            model = ParakeetModel.from_dir(model, self.device, dtype)
        self.model = model
        self.default_lookahead = self._check_lookahead(lookahead or model.cfg.default_lookahead)
        if max_num_streams == "auto":
            max_num_streams = auto_num_streams(model, self.device, dtype)
        self.scheduler = Scheduler(model, int(max_num_streams), max_queue, self.device, dtype)
        if batch_wait is None:  # a quarter of the shortest chunk: bigger steps, bounded extra latency
            batch_wait = 0.25 * min(self.chunk_seconds(m) for m in self.lookahead_modes)
        self.runner = ModelRunner(model, self.scheduler, self._on_release, endpoint_seconds, max_batch, batch_wait)
        self._seqs: dict[int, Sequence] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._updated = threading.Condition()
        self._audio_seconds = 0.0
        self._started = False

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
        seq = Sequence(
            stream_id=sid,
            lookahead=mode,
            spec=self.model.encoder.chunk_spec(mode),
            frames=FeatureStream(self.model.features),
            detok=IncrementalDetokenizer(self.model.tokenizer),
            n_mels=self.model.cfg.features.n_mels,
        )
        with self._lock:
            self._seqs[sid] = seq
        try:
            self.scheduler.add(seq)
        except QueueFullError:
            with self._lock:
                del self._seqs[sid]
            raise QueueFull() from None
        return sid

    def queue_position(self, sid: int) -> int:
        return self.scheduler.position(self._seq(sid))

    def push_audio(self, sid: int, samples) -> None:
        seq = self._seq(sid)
        if seq.final_requested or seq.cancelled:
            raise EngineError("stream_closed", "audio after the end of the stream")
        if seq.failed:
            raise EngineError("inference_error", "the stream failed")
        samples = check_samples(np.asarray(samples, dtype=np.float32))
        if samples.size:
            seq.add_samples(samples)
            with self._lock:
                self._audio_seconds += samples.size / self.sample_rate
            self.runner.wake(seq)

    def finalize(self, sid: int) -> None:
        seq = self._seq(sid)
        if seq.final_requested or seq.cancelled:
            return
        seq.final_requested = True
        self.runner.wake(seq)

    def cancel(self, sid: int) -> None:
        with self._lock:
            seq = self._seqs.pop(sid, None)
        if seq is None:
            return
        if seq.status is Status.WAITING:
            seq.cancelled = True
            self._notify_all(self.scheduler.remove_waiting(seq))
            if seq.slot is None:
                return
        self.runner.cancel(seq)

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

    def _on_release(self, seq: Sequence) -> None:
        changed = self.scheduler.release(seq)
        for other in changed:
            if other.slot is not None:
                self.runner.wake(other)
        self._notify_all(changed)

    @staticmethod
    def _notify_all(seqs) -> None:
        for s in seqs:
            s.notify()

"""ASREngine: the public API over Scheduler and ModelRunner, used by the server, CLIs and tests;
the StepRoute (step_route.py) joins them."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..audio import SAMPLE_RATE, check_samples
from ..host import responsive_threads
from ..model.config import Lookahead
from ..model.parakeet import ParakeetModel
from .builder import build
from .calibration import calibrate
from .chunker import FrontEnd
from .config import EngineConfig
from .errors import EngineError, QueueFull
from .inbox import push_many
from .phrases import LabelPriors, Phrase, boosting_tree
from .results import DecoderProgress, StreamResult
from .sequence import Sequence, Status
from .step import Step, StepTotals
from .step_route import StepRoute, notify


class ASREngine:
    sample_rate = SAMPLE_RATE

    def __init__(self, model: str | Path | ParakeetModel = "demo", device: str = "cpu", **options):
        """`options`: EngineConfig's fields (config.py)."""
        self.config = EngineConfig(model, device, **options)
        parts = build(self.config)
        self.model, self.device, self.modes, self.languages = parts.model, parts.device, parts.modes, parts.languages
        self.scheduler, self.runner, self.results, self.info = parts.scheduler, parts.runner, parts.results, parts.info
        self.diarizer = parts.diarizer
        self.lookahead_modes, self.default_lookahead = self.modes.served, self.modes.default
        self._label_priors = LabelPriors(self.model.decoder.label_prior)
        self.route = StepRoute(self.scheduler, self.runner, self.results, self.diarizer, self.device, self.config.threads,
                               self._forget)
        self.pipeline = self.route.pipeline
        self._seqs: dict[int, Sequence] = {}
        self._lock = threading.Lock()
        self.forget_streams()
        self._started = False

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> "ASREngine":
        if not self._started:
            if self.config.calibrate:  # its steps on this thread, before the stage threads take them
                calibrate(self)
            responsive_threads()
            self.pipeline.start()
            self._started = True
        return self

    def forget_streams(self) -> None:
        """Stream ids from 1 again, and no audio or step counted yet (no stream may be open)."""
        with self._lock:
            self._ids = itertools.count(1)
            self._audio_seconds = 0.0
        self.route.forget_totals()

    def shutdown(self) -> None:
        if self._started:
            self.scheduler.stop()
            self.pipeline.join(timeout=10)
            self._started = False

    def __enter__(self) -> "ASREngine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # --- model facts ------------------------------------------------------------------------
    def chunk_seconds(self, lookahead: Lookahead | None = None) -> float:
        return self.modes.chunk_seconds(self.modes.check(lookahead or self.default_lookahead))

    def check_phrases(self, phrases: tuple[Phrase, ...]) -> None:
        """PhraseError where a stream could not boost `phrases` (create_stream's check, for a
        protocol that learns of its phrases before its first stream opens)."""
        boosting_tree(phrases, self.model.tokenizer)

    def check_language(self, language: str | None) -> str | None:
        """The language a stream asking for `language` gets (create_stream's check, for a protocol
        that learns of it before its first stream opens); EngineError `unsupported_language`."""
        return self.languages.resolve(language)

    # --- streams --------------------------------------------------------------------------
    def create_stream(self, lookahead: Lookahead | None = None, bulk: bool = False,
                      phrases: tuple[Phrase, ...] = (), language: str | None = None, diarize: bool = False) -> int:
        """A new stream (admitted now, or queued). A bulk stream's audio is all there at once (a file):
        it has no deadlines and fills the capacity live streams leave (policy.py), in the longest
        lookahead mode unless `lookahead` says otherwise. `phrases` (phrases.check_phrases) are
        boosted in its decoding; PhraseError where the model cannot take them. `language`: what a
        multilingual model transcribes ("de-DE", "de", "auto"; default: the model's automatic
        language ID), EngineError `unsupported_language` where the model has no such language
        (languages.py). `diarize`: its results carry speakers (diarizer.py), EngineError
        `diarization_unavailable` on an engine without a diarizer."""
        language = self.languages.resolve(language)
        check_diarize(self.info, diarize)
        tree = boosting_tree(phrases, self.model.tokenizer, self._label_priors)
        if lookahead is not None:
            mode = self.modes.check(lookahead)
        else:
            mode = self.info.bulk_lookahead if bulk else self.default_lookahead
        sid = next(self._ids)
        seq = Sequence(
            stream_id=sid,
            lookahead=mode,
            inbox=self.modes.inbox(mode),
            front=FrontEnd(self.model.features, self.model.encoder.chunk_spec(mode)),
            decoding=DecoderProgress(self.model.tokenizer, language),
            bulk=bulk,
            boosting=tree,
            prompt=None if language is None else self.model.cfg.prompt.index(language),
            diarize=diarize,
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
        if (closed := _closed(seq)) is not None:
            raise closed
        samples = check_samples(np.asarray(samples, dtype=np.float32))
        if samples.size:
            if seq.inbox.add(samples):  # a push that makes no chunk ready changes no scheduling decision
                self.scheduler.chunk_ready()
            with self._lock:
                self._audio_seconds += samples.size / self.sample_rate

    def push_many(self, sids: list[int], packets: list[np.ndarray]) -> None:
        """push_audio for packets of many streams at once (the engine service's Audio messages),
        their samples already checked: float32, 1-D, finite. A stream that is unknown, over or
        failed skips its packet (its results say why); the Scheduler is woken once."""
        with self._lock:
            seqs = [self._seqs.get(sid) for sid in sids]
        taking = [(seq, samples) for seq, samples in zip(seqs, packets)
                  if seq is not None and samples.size and _closed(seq) is None]
        ready = push_many([seq.inbox for seq, _ in taking], [samples for _, samples in taking], self.scheduler.table)
        if ready:
            self.scheduler.chunk_ready()
        with self._lock:
            self._audio_seconds += sum(samples.size for _, samples in taking) / self.sample_rate

    def finalize(self, sid: int) -> None:
        self.scheduler.finalize(self._seq(sid))

    def cancel(self, sid: int) -> None:
        with self._lock:
            seq = self._seqs.pop(sid, None)
        if seq is not None:
            notify(self.scheduler.cancel(seq))

    def collect(self, sid: int) -> list[StreamResult]:
        with self._lock:
            seq = self._seqs.get(sid)
        if seq is None:
            return []
        results, waited = seq.outbox.take()
        if waited is not None and not seq.bulk:  # the delivery part of the latency target (latency.py)
            self.scheduler.delivered(waited)
        if any(r.is_final for r in results):
            with self._lock:
                self._seqs.pop(sid, None)
        return results

    def send_rows(self, sid: int, sink) -> None:
        """The stream's results go to `sink` as rows (result_rows.py), not to its outbox: one
        `sink.put(rows, live)` per step for all of that sink's streams (`live`: the step had a live
        stream's chunk: its delivery counts towards the latency target, `delivered`). The engine
        service's WorkerConnection does this for its streams: its worker process builds their results. Errors
        and queue news still come through the outbox and its listeners."""
        self._seq(sid).sink = sink

    def delivered(self, seconds: float) -> None:
        """Results of a live stream that went to a sink reached their client `seconds` after the step."""
        self.scheduler.delivered(seconds)

    def _forget(self, sids: Iterable[int]) -> None:
        """Streams whose final result went to their sink: no longer this engine's to answer for."""
        with self._lock:
            for sid in sids:
                self._seqs.pop(sid, None)

    def add_listener(self, sid: int, callback: Callable[[], None]) -> None:
        self._seq(sid).outbox.listen(callback)

    def wait_for_update(self, sid: int, timeout: float | None = None) -> bool:
        """Block until the stream has results or its queue position changed (True), or timeout."""
        return self._seq(sid).outbox.wait(timeout)

    def healthy(self) -> bool:
        """The stage threads are running and none is stalled on one step (pipeline.py): False once one
        has died, while one is stalled, or after the engine stopped."""
        return self._started and self.pipeline.alive() and self.pipeline.stalled() is None

    def latency_figures(self) -> dict[str, float]:
        """The latency target and what the Scheduler learned of the path around its steps (latency.py)."""
        return self.scheduler.latency_figures()

    def stats(self) -> dict:
        out = self.scheduler.stats()
        with self._lock:
            out["audio_seconds"] = self._audio_seconds
        stall = self.pipeline.stalled()
        out["stalled"] = stall.as_dict() if stall else None
        return out

    # --- steps (step_route.py) ------------------------------------------------------------
    def step_totals(self) -> StepTotals:
        """The work of every step delivered so far (a copy): steps, chunks encoded, seconds per stage."""
        return self.route.totals()

    def step(self) -> Step | None:
        """One whole step on the calling thread (None once the engine stopped): what the stage threads
        run spread out, a step in flight per stage thread. For a caller that drives the engine itself
        (tests, tools): the engine must not be started, or its threads take the steps."""
        return self.route.step()

    def step_stages(self) -> list[tuple[str, Callable[[Step], None]]]:
        """What runs on a step once the Scheduler picked it, in order (StepRoute)."""
        return list(self.route.stages)

    # --- internals ------------------------------------------------------------------------
    def _seq(self, sid: int) -> Sequence:
        with self._lock:
            seq = self._seqs.get(sid)
        if seq is None:
            raise EngineError("unknown_stream", f"no stream {sid}")
        return seq


def check_diarize(info, diarize: bool) -> None:
    """EngineError `diarization_unavailable` where a stream asks for speakers the engine cannot give."""
    if diarize and not info.speakers:
        raise EngineError("diarization_unavailable", "this server has no diarizer (parakeet-serve --diarizer demo|sortformer|PATH)")


def _closed(seq: Sequence) -> EngineError | None:
    """Why the stream takes no more audio, or None while it does."""
    if seq.status is Status.FAILED:
        return EngineError("inference_error", "the stream failed")
    if seq.final_at is not None or seq.status in (Status.CANCELLED, Status.FINISHED):
        return EngineError("stream_closed", "audio after the end of the stream")
    return None

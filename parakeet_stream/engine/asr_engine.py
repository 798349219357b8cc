"""ASREngine: the public API over Scheduler and ModelRunner, used by the server, CLIs and tests,
and the step route that joins them."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from ..audio import SAMPLE_RATE, check_samples
from ..host import free_memory, responsive_threads, stage_threads, stages_beside
from ..model.config import Lookahead
from ..model.loading import load_model
from ..model.parakeet import ParakeetModel
from ..model.precision import check_precision, set_precision
from .calibration import calibrate
from .chunker import FrontEnd
from .errors import EngineError, QueueFull
from .inbox import Inbox, push_many
from .info import EngineInfo
from .languages import Languages
from .latency import DEFAULT_TARGET
from .memory import MAX_SLOTS, plan_memory, slot_bytes, stream_bytes
from .options import auto_num_streams
from .phrases import LabelPriors, Phrase, boosting_tree
from .pipeline import DEPTH, Pipeline, Stage
from .policy import bulk_lookahead
from .result_rows import ResultRows
from .results import DecoderProgress, ResultBuilder, StreamResult
from .runner.cuda_streams import device_at
from .runner.model_runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .step import Step, StepItem, StepTotals

log = logging.getLogger(__name__)


class ASREngine:
    sample_rate = SAMPLE_RATE

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
        latency_target: float = DEFAULT_TARGET,
        threads: int | None = None,
        cuda_graphs: bool | None = None,
        auto_limit: int | None = None,
        modes: Iterable[Lookahead] | None = None,
        calibrate: bool = True,
    ):
        """max_batch: most streams per step (default: every slot on CPU; sized to memory on CUDA,
        memory.py); latency_target: seconds, p95 from a chunk's last sample to its result taken
        (latency.py); cuda_graphs: replay encoder and decoder from CUDA graphs (default: on CUDA);
        auto_limit: with max_num_streams "auto", at most this many slots (the server's bound: what its
        connections may take of the host's memory); modes: the lookahead modes served (default: every
        mode of the model; graphs are captured for these only, and streams may ask for no other);
        calibrate: measure the step cost when the engine starts, before any client (calibration.py;
        off for a tool that serves files only, which admission does not pace)."""
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        started = time.monotonic()
        lap = _Laps()
        self.device = torch.device(device)
        check_precision(self.device, dtype, quantize)  # before any weights move
        if not isinstance(model, ParakeetModel):
            model = load_model(model, self.device)
        lap("load")
        self.model = set_precision(model, dtype, quantize)
        lap("precision")
        self.device = model.features.fb.device  # with its index: what CUDA calls need ("cuda" -> "cuda:0")
        self.lookahead_modes = self._served(modes)
        self.default_lookahead = self._check_lookahead(lookahead or next(
            (mode for mode in (model.cfg.default_lookahead, *self.lookahead_modes) if mode in self.lookahead_modes)))
        self.languages = Languages(tuple(model.cfg.prompt.languages) if model.cfg.prompt else ())
        self._label_priors = LabelPriors(self.model.decoder.label_prior)
        most = min(auto_limit or MAX_SLOTS, MAX_SLOTS)
        if self.device.type == "cuda":
            plan = plan_memory(free_memory(self.device), slot_bytes(model), stream_bytes(model),
                               None if max_num_streams == "auto" else int(max_num_streams), max_batch,
                               most=most)
            max_num_streams, max_batch = plan.slots, plan.max_batch
        elif max_num_streams == "auto":
            max_num_streams = auto_num_streams(model, self.device, model.encoder_dtype, cap=most)
        self.scheduler = Scheduler(int(max_num_streams), max_queue, latency_target, self.sample_rate, max_batch,
                                   max_in_flight=DEPTH, lead=self._first_chunk_seconds(model))
        lap("memory")
        self.runner = ModelRunner(model, self.scheduler.max_num_streams, self.scheduler.max_batch, cuda_graphs,
                                  self.default_lookahead, self.lookahead_modes)
        lap("pools")
        self.runner.capture()  # before the stage threads run: a capture must not overlap their work
        lap("capture")
        tok = model.tokenizer
        endpoint_frames = max(1, round(endpoint_seconds / model.frame_seconds))
        self.results = ResultBuilder(model.frame_seconds, tok.eou_id if tok else None, endpoint_frames,
                                     tok.language_tags if tok else None)
        self.pipeline = self._route(threads)
        self._whole_step = Stage("step", tuple(self.step_stages()))
        self._seqs: dict[int, Sequence] = {}
        self._lock = threading.Lock()
        self.forget_streams()
        self._calibrate = calibrate
        self._started = False
        self.info = EngineInfo(
            sample_rate=self.sample_rate,
            frame_seconds=model.frame_seconds,
            tokenizer=model.tokenizer,
            lookahead_modes=tuple(self.lookahead_modes),
            default_lookahead=self.default_lookahead,
            bulk_lookahead=bulk_lookahead(self.lookahead_modes),
            chunk_seconds={mode: self.chunk_seconds(mode) for mode in self.lookahead_modes},
            ready_samples={mode: self._inbox(mode).readiness for mode in self.lookahead_modes},
            precision=model.precision,
            start_seconds=round(time.monotonic() - started, 2),
            cuda_graphs=self.runner.graph_count,
            start_phases=lap.seconds,
            languages=self.languages.names,
            default_language=self.languages.default,
            endpoint_frames=endpoint_frames,
        )
        log.info("engine ready in %.1f s (%s)", self.info.start_seconds,
                 ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in lap.seconds.items()))

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> "ASREngine":
        if not self._started:
            if self._calibrate:  # its steps on this thread, before the stage threads take them
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
            stages = [name for name, _ in self.step_stages()]
            self._totals = StepTotals(seconds=dict.fromkeys(stages, 0.0))  # every stage in /metrics from the start

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
        spec = self.model.encoder.chunk_spec(self._check_lookahead(lookahead or self.default_lookahead))
        return spec.chunk_frames * self.model.cfg.features.hop_length / self.sample_rate

    def _first_chunk_seconds(self, model: ParakeetModel) -> float:
        """Audio a new stream sends before its first chunk is ready, in its quickest mode."""
        first = min(model.encoder.chunk_spec(mode).first_frames for mode in self.lookahead_modes)
        return (first - 1) * model.cfg.features.hop_length / self.sample_rate

    def _served(self, modes: Iterable[Lookahead] | None) -> list[Lookahead]:
        if modes is None:
            return list(self.model.cfg.encoder.att_context_sizes)
        served = list(dict.fromkeys(self._model_mode(mode) for mode in modes))
        if not served:
            raise EngineError("bad_lookahead", "no lookahead mode to serve")
        return served

    def _check_lookahead(self, lookahead) -> Lookahead:
        mode = self._model_mode(lookahead)
        if mode not in self.lookahead_modes:
            raise EngineError("bad_lookahead", f"lookahead {mode[0]},{mode[1]} is not served here "
                                               f"(served: {', '.join(f'{a},{b}' for a, b in self.lookahead_modes)})")
        return mode

    def _model_mode(self, lookahead) -> Lookahead:
        try:
            return self.model.encoder.check_lookahead(lookahead)
        except (ValueError, TypeError, IndexError) as exc:
            raise EngineError("bad_lookahead", str(exc)) from None

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
                      phrases: tuple[Phrase, ...] = (), language: str | None = None) -> int:
        """A new stream (admitted now, or queued). A bulk stream's audio is all there at once (a file):
        it has no deadlines and fills the capacity live streams leave (policy.py), in the longest
        lookahead mode unless `lookahead` says otherwise. `phrases` (phrases.check_phrases) are
        boosted in its decoding; PhraseError where the model cannot take them. `language`: what a
        multilingual model transcribes ("de-DE", "de", "auto"; default: the model's automatic
        language ID), EngineError `unsupported_language` where the model has no such language
        (languages.py)."""
        language = self.languages.resolve(language)
        tree = boosting_tree(phrases, self.model.tokenizer, self._label_priors)
        if lookahead is not None:
            mode = self._check_lookahead(lookahead)
        else:
            mode = self.info.bulk_lookahead if bulk else self.default_lookahead
        sid = next(self._ids)
        seq = Sequence(
            stream_id=sid,
            lookahead=mode,
            inbox=self._inbox(mode),
            front=FrontEnd(self.model.features, self.model.encoder.chunk_spec(mode)),
            decoding=DecoderProgress(self.model.tokenizer, language),
            bulk=bulk,
            boosting=tree,
            prompt=None if language is None else self.model.cfg.prompt.index(language),
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
            _notify(self.scheduler.cancel(seq))

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
        stream's chunk: its delivery counts towards the latency target, `delivered`). An engine
        service's client does this for its streams: its worker process builds their results. Errors
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

    def step_totals(self) -> StepTotals:
        """The work of every step delivered so far (a copy): steps, chunks encoded, seconds per stage."""
        with self._lock:
            return StepTotals(self._totals.steps, self._totals.chunks, dict(self._totals.seconds))

    # --- one step, in order: schedule -> pre-encode -> encode -> decode -> results -> postprocess -> publish
    def step(self) -> Step | None:
        """One whole step on the calling thread (None once the engine stopped): what the stage threads
        run spread out, two steps in flight (`_route`). For a caller that drives the engine itself
        (tests, tools): the engine must not be started, or its threads take the steps."""
        step = self.scheduler.schedule()  # the streams to run and their chunks (blocks until there are)
        if step is not None and self.pipeline.run(self._whole_step, step):  # model stages, then results
            self._deliver(step)  # postprocess (slots freed, waiters admitted), then publish
        return step

    def step_stages(self) -> list[tuple[str, Callable[[Step], None]]]:
        """What runs on a step once the Scheduler picked it (`Scheduler.schedule`), in order, each
        timed under its name; `_deliver` then ends it: postprocess (slots released, waiters
        admitted), then publish. The runner's stages are looked up at each step, so replacing one
        (fault injection) works."""
        runner = self.runner
        return [
            ("pre-encode", lambda step: runner.pre_encode(step)),  # features, subsampling
            ("encode", lambda step: runner.encode(step)),  # the cache-aware layers
            ("decode", lambda step: runner.decode(step)),  # greedy RNN-T: tokens
            ("results", self._results),  # tokens -> text, times, end of utterance
        ]

    def _route(self, threads: int | None) -> Pipeline:
        """The step's stages spread over threads (pipeline.py): pre-encode, encode, and decode with
        results, each on its own thread; where the encoder's team takes every core
        (host.stages_beside), all of them on one thread, one step at a time."""
        enter = self.runner.streams.enter
        team = stage_threads(self.device, encoder=True, threads=threads)
        alone = stage_threads(self.device, encoder=False, threads=threads)
        pre_encode, encode, *decode = self.step_stages()
        if stages_beside(self.device, team):
            stages = [Stage("pre-encode", (pre_encode,), alone, partial(enter, "pre-encode")),
                      Stage("encode", (encode,), team, partial(enter, "encode")),
                      Stage("decode", tuple(decode), alone, partial(enter, "decode"))]
        else:  # on a CPU whose every core is in the encoder's team: step() on one thread, in a loop
            stages = [Stage("step", (pre_encode, encode, *decode), team)]
        return Pipeline(schedule=self.scheduler.schedule, stages=stages, deliver=self._deliver, fail=self._fail,
                        device_at=device_at)

    def _results(self, step: Step) -> None:
        """Each chunk's result from its new tokens; a stream's last step adds its final result. A
        stream with a sink gets them as rows, its sink's streams' in one ResultRows."""
        now, sunk, build = time.monotonic(), {}, self.results.build
        for item in step:
            if not item.live:
                continue
            seq = item.seq
            if seq.sink is not None:
                sunk.setdefault(seq.sink, []).extend(_rows(item, now))
                continue
            for r, tokens in enumerate(item.tokens):
                step.results.append((seq, build(seq.stream_id, seq.decoding, tokens, item.frames[r], False,
                                                now - _ready_at(item, r), item.eou[r])))
            if item.last:
                step.results.append((seq, build(seq.stream_id, seq.decoding, item.final_tokens, 0, True, None)))
        step.rows = [(sink, ResultRows.of(rows)) for sink, rows in sunk.items()]

    def _deliver(self, step: Step) -> None:
        if log.isEnabledFor(logging.DEBUG):
            ms = {k: round(v * 1000, 1) for k, v in step.seconds.items()}
            wall = (time.monotonic() - step.started) * 1000
            log.debug("step: %d streams, %d results, %s ms, %.1f ms wall", len(step), len(step.results), ms, wall)
        _, changed = self.scheduler.postprocess(step)  # first, so a slot is free once its final result is out
        with self._lock:
            self._totals.add(step)
        for seq, result in step.results:
            seq.outbox.publish(result, notify=False)
        if step.rows:
            live = not all(item.seq.bulk for item in step)
            for sink, rows in step.rows:
                sink.put(rows, live)
            self._forget(sid for _, rows in step.rows for sid in rows.sids[rows.final].tolist())
        _notify(list(dict.fromkeys([*(seq for seq, _ in step.results), *changed])))

    def _fail(self, step: Step) -> None:
        failed, changed = self.scheduler.postprocess(step, failed=True)
        for seq in failed:
            seq.outbox.publish(StreamResult(seq.stream_id, [], "", is_final=True, error="inference_error"))
        _notify(changed)

    # --- internals ------------------------------------------------------------------------
    def _inbox(self, mode: Lookahead) -> Inbox:
        features = self.model.cfg.features
        return Inbox(self.model.encoder.chunk_spec(mode), features.hop_length, features.n_fft)

    def _seq(self, sid: int) -> Sequence:
        with self._lock:
            seq = self._seqs.get(sid)
        if seq is None:
            raise EngineError("unknown_stream", f"no stream {sid}")
        return seq


class _Laps:
    """Seconds of each phase of the engine's start-up, in order (each call ends one)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def __call__(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._last, 2)
        self._last = now


def _ready_at(item: StepItem, r: int) -> float:
    """When the item's chunk `r` was ready: its last sample's arrival, or the final for one cut at the end."""
    return item.ready_times[r] if r < len(item.ready_times) else item.final_at


def _rows(item: StepItem, now: float) -> list:
    """The item's results as ResultRows rows: a row per chunk, then its final in its last step."""
    sid = item.seq.stream_id
    rows = [(sid, tokens, item.frames[r], False, now - _ready_at(item, r), item.eou[r])
            for r, tokens in enumerate(item.tokens)]
    if item.last:
        rows.append((sid, item.final_tokens, 0, True, None, 0.0))
    return rows


def _notify(seqs: list[Sequence]) -> None:
    """Tell the streams' listeners of news: results, or a slot or queue place that changed."""
    for seq in seqs:
        seq.outbox.notify()


def _closed(seq: Sequence) -> EngineError | None:
    """Why the stream takes no more audio, or None while it does."""
    if seq.status is Status.FAILED:
        return EngineError("inference_error", "the stream failed")
    if seq.final_at is not None or seq.status in (Status.CANCELLED, Status.FINISHED):
        return EngineError("stream_closed", "audio after the end of the stream")
    return None

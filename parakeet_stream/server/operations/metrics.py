"""Prometheus metrics: engine gauges read at scrape time, plus server-side series."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

if TYPE_CHECKING:
    from ...engine.api import EngineAPI

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's variable
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
FINAL_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class EngineCollector:
    def __init__(self, engine: EngineAPI) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats, totals = self._engine.stats(), self._engine.step_totals()
        yield GaugeMetricFamily("parakeet_active_streams", "Streams holding an engine slot", stats["active"])
        yield GaugeMetricFamily("parakeet_queued_streams", "Streams waiting for a slot", stats["queued"])
        yield GaugeMetricFamily("parakeet_free_slots", "Live streams admitted now without waiting", stats["free_slots"])
        yield GaugeMetricFamily("parakeet_capacity_streams", "Live streams the measured step cost serves in real time",
                                stats["capacity"])
        yield GaugeMetricFamily("parakeet_max_num_streams", "Engine slots in all", stats["max_num_streams"])
        yield GaugeMetricFamily("parakeet_streams_behind", "Live streams with more than one chunk waiting at the "
                                "last step's plan", stats["streams_behind"])
        yield GaugeMetricFamily("parakeet_oldest_chunk_wait_seconds", "How long the oldest waiting live chunk had "
                                "waited at the last step's plan", stats["oldest_chunk_wait_s"])
        yield GaugeMetricFamily("parakeet_stalled_seconds", "How long a stage has been on one step, once past the "
                                "stall limit (0: no stall)", (stats["stalled"] or {}).get("seconds", 0))
        yield CounterMetricFamily(
            "parakeet_audio_seconds", "Seconds of audio processed by the engine", stats["audio_seconds"]
        )
        yield CounterMetricFamily("parakeet_steps", "Engine steps run", totals.steps)
        yield CounterMetricFamily(
            "parakeet_step_chunks", "Chunks encoded by the engine's steps (per step: the mean batch)", totals.chunks
        )
        stages = CounterMetricFamily(
            "parakeet_stage_seconds",
            "Seconds each engine stage spent on steps (host time: on CUDA, launching and waiting)",
            labels=["stage"],
        )
        for stage, seconds in totals.seconds.items():
            stages.add_metric([stage], seconds)
        yield stages


class Metrics:
    """The server's metrics. In a worker process (workers.py, PROMETHEUS_MULTIPROC_DIR set) each
    worker writes its series to files there and any worker renders every worker's, summed
    (prometheus_client's multiprocess mode): one view of the whole server on every worker."""

    def __init__(self, engine: EngineAPI) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine))
        shared = os.environ.get(MULTIPROCESS_DIR)
        if shared:  # the series live in the files; the registry reads them all
            MultiProcessCollector(self.registry, shared)
        own = None if shared else self.registry
        self.chunk_latency = Histogram(
            "parakeet_chunk_latency_seconds",
            "From the arrival of the last sample a chunk needs to its result being sent",
            buckets=LATENCY_BUCKETS,
            registry=own,
        )
        self.time_to_final = Histogram(
            "parakeet_time_to_final_seconds",
            "From the client's final/close to the final result being sent",
            buckets=FINAL_BUCKETS,
            registry=own,
        )
        self.queue_wait = Histogram(
            "parakeet_queue_wait_seconds",
            "From a stream's first wait for a slot to its admission (streams that waited), by protocol",
            ["protocol"],
            buckets=FINAL_BUCKETS,
            registry=own,
        )
        self.errors = Counter(
            "parakeet_errors", "Errors reported to clients, by code", ["code"], registry=own
        )
        self.connections = Gauge(
            "parakeet_connections", "Open client connections", ["protocol"], registry=own,
            multiprocess_mode="livesum",
        )
        self.streams = Counter(
            "parakeet_streams", "Engine streams opened", ["protocol"], registry=own
        )

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

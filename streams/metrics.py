"""Prometheus metrics of a streams worker (its own registry, served on 127.0.0.1)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from schemas.messages import Diagnosis


class StreamMetrics:
    """Counters of what a worker took, rejected and concluded, and how long it took."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.messages = Counter(
            "c4_stream_messages",
            "Decoded v1 messages taken, by kind",
            ["kind"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "c4_stream_rejected",
            "Records sent to the dead letter topic, by topic and reason code",
            ["topic", "code"],
            registry=self.registry,
        )
        self.late = Counter(
            "c4_stream_late_dropped",
            "Messages beyond the lateness bound, counted and dropped",
            registry=self.registry,
        )
        self.diagnoses = Counter(
            "c4_stream_diagnoses",
            "Diagnoses published, by class and state",
            ["class", "state"],
            registry=self.registry,
        )
        self.processing = Histogram(
            "c4_stream_processing_seconds",
            "Time to process one message in the detectors",
            buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5),
            registry=self.registry,
        )
        self.event_time = Gauge(
            "c4_stream_event_time_seconds",
            "The detectors' event-time clock (Unix seconds)",
            registry=self.registry,
        )
        self.lag = Gauge(
            "c4_stream_consumer_lag",
            "Records behind the end of the log, by topic (this worker's partitions)",
            ["topic"],
            registry=self.registry,
        )
        self.snapshots = Counter(
            "c4_stream_snapshots",
            "Detector state snapshots written to the state tables",
            registry=self.registry,
        )
        self.restored = Counter(
            "c4_stream_restored",
            "Jobs and nodes taken over from a snapshot (restart or rebalance)",
            registry=self.registry,
        )
        self.tracked_jobs = Gauge(
            "c4_stream_tracked_jobs",
            "Jobs whose detectors this worker holds",
            registry=self.registry,
        )

    def record_diagnoses(self, found: list[Diagnosis]) -> None:
        """Count published diagnoses."""
        for diagnosis in found:
            self.diagnoses.labels(diagnosis.class_, diagnosis.state).inc()

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP in a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)

"""Prometheus metrics of a streams worker (its own registry, served on 127.0.0.1 by default).

Besides the worker's counters, the findings it holds open: ``c4_finding_open`` (1 per open
finding, labelled with its best suspect) and ``c4_finding_score`` (one series per suspect),
read at scrape time from a snapshot the worker takes on its event loop (`set_open_findings`).
A finding lives with the worker that owns its job's (or node's, or the fabric correlator's)
partition, so across a group of workers each open finding is exported exactly once, and a
resolved one is simply gone from the next scrape.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from schemas.messages import Diagnosis
from schemas.places import suspect_place
from schemas.version import installed_version
from streams.core.findings import OpenFinding

NS_PER_S = 1_000_000_000
# The labels of c4_finding_open and c4_finding_score. ``training_job``, not ``job``: a
# scraped ``job`` label would clash with the scrape job's (Prometheus renames it
# ``exported_job``). ``Hostname`` and ``gpu`` are dcgm-exporter's names, ``device`` and
# ``port`` node_exporter's InfiniBand ones (``mlx5_0``, ``1``): a finding joins their series.
FINDING_LABELS = (
    "diagnosis",
    "class",
    "training_job",
    "suspect",
    "suspect_type",
    "node",
    "Hostname",
    "gpu",
    "device",
    "port",
)


def suspect_labels(kind: str, suspect: str) -> dict[str, str]:
    """The node, GPU and NIC labels of a suspect id: ``node-001/gpu3`` -> node and Hostname
    ``node-001``, gpu ``3``; ``node-001/mlx5_0:1`` -> device ``mlx5_0``, port ``1``; a node
    is its own node; ranks, fabric links and switches name no node (empty labels)."""
    place = suspect_place(kind, suspect)
    return {
        "node": place.node or "",
        "Hostname": place.node or "",
        "gpu": place.gpu or "",
        "device": place.device or "",
        "port": place.port or "",
    }


@dataclass(frozen=True, slots=True)
class FindingRow:
    """One suspect of an open finding, as label values (in `FINDING_LABELS` order) and score."""

    labels: tuple[str, ...]
    score: float
    best: bool  # the finding's first suspect: the one c4_finding_open names


def finding_rows(finding: OpenFinding) -> list[FindingRow]:
    """The rows of one open finding: one per suspect, best first."""
    rows = []
    for index, suspect in enumerate(finding.suspects):
        parts = suspect_labels(suspect.type, suspect.id)
        labels = (
            finding.id,
            finding.cls,
            finding.job or "",
            suspect.id,
            suspect.type,
            parts["node"],
            parts["Hostname"],
            parts["gpu"],
            parts["device"],
            parts["port"],
        )
        score = round(min(1.0, max(0.0, suspect.score)), 4)  # as the diagnosis says it
        rows.append(FindingRow(labels, score, index == 0))
    return rows


class FindingCollector(Collector):
    """``c4_finding_open`` and ``c4_finding_score`` from the last snapshot of open findings."""

    def __init__(self) -> None:
        self.rows: tuple[FindingRow, ...] = ()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self.rows  # one read: the event loop replaces the tuple, never changes it
        opened = GaugeMetricFamily(
            "c4_finding_open",
            "1 per finding firing now, labelled with its best suspect (gone once resolved)",
            labels=FINDING_LABELS,
        )
        scores = GaugeMetricFamily(
            "c4_finding_score",
            "Score (0..1) of each suspect of a finding firing now",
            labels=FINDING_LABELS,
        )
        for row in rows:
            if row.best:
                opened.add_metric(row.labels, 1.0)
            scores.add_metric(row.labels, row.score)
        yield opened
        yield scores


class StreamMetrics:
    """Counters of what a worker took, rejected and concluded, and how long it took."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.build = Gauge(
            "c4_build_info", "The c4 version this worker runs", ["version"], registry=self.registry
        )
        self.build.labels(installed_version()).set(1)
        self.messages = Counter(
            "c4_stream_messages",
            "Decoded v1 messages taken, by kind",
            ["kind"],
            registry=self.registry,
        )
        self.operations = Counter(
            "c4_stream_operations",
            "Collective operations reported, by training job",
            ["training_job"],
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
        self.detection_latency = Histogram(
            "c4_stream_detection_latency_seconds",
            "Event time from a finding's onset to its firing diagnosis, by class",
            ["class"],
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=self.registry,
        )
        self.processing = Histogram(
            "c4_stream_processing_seconds",
            "Time to process one input record's messages in the detectors",
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
        self._lag_topics: set[str] = set()
        self.findings = FindingCollector()
        self.registry.register(self.findings)

    def record_diagnoses(self, found: list[Diagnosis]) -> None:
        """Count published diagnoses; the detection latency of the firing ones."""
        for diagnosis in found:
            self.diagnoses.labels(diagnosis.class_, diagnosis.state).inc()
            if diagnosis.state == "firing":
                latency_s = max(0, diagnosis.ts_ns - diagnosis.onset_ns) / NS_PER_S
                self.detection_latency.labels(diagnosis.class_).observe(latency_s)

    def set_lag(self, lag: Mapping[str, int], assigned: Set[str]) -> None:
        """Consumer lag by topic; a topic none of whose partitions is read here any more
        reads 0, not its last value (which another worker reports now)."""
        for topic in self._lag_topics - assigned:
            self.lag.labels(topic).set(0)
        for topic, value in lag.items():
            self.lag.labels(topic).set(value)
        self._lag_topics.update(lag)

    def set_open_findings(self, findings: Iterable[OpenFinding]) -> None:
        """The findings this worker holds open now (replaces the previous snapshot)."""
        rows: dict[tuple[str, ...], FindingRow] = {}
        for finding in findings:
            for row in finding_rows(finding):
                rows.setdefault(row.labels, row)  # a suspect named twice: exported once
        self.findings.rows = tuple(rows[labels] for labels in sorted(rows))

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` over HTTP on ``address:port`` in a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)

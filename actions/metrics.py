"""Prometheus metrics of an action worker (its own registry, served on 127.0.0.1 by default)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from schemas.messages import Action
from schemas.version import installed_version

# The busiest links of a plan exported one series each: enough to draw the hot spots of a
# large fabric without a series per link of it.
PLAN_LINKS_EXPORTED = 100
DEADLETTER_SOURCES = ("diagnosis", "job", "webhook", "slurm", "kubernetes", "alertmanager")


class ActionMetrics:
    """Counters of what a worker consumed, decided and retried."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.build = Gauge(
            "c4_build_info", "The c4 version this worker runs", ["version"], registry=self.registry
        )
        self.build.labels(installed_version()).set(1)
        self.diagnoses = Counter(
            "c4_action_diagnoses",
            "Diagnoses taken, by outcome (handled, duplicate, fenced, rejected)",
            ["outcome"],
            registry=self.registry,
        )
        self.records = Counter(
            "c4_action_records",
            "Action records published, by action, status and reason",
            ["action", "status", "reason"],
            registry=self.registry,
        )
        self.jobs = Counter(
            "c4_action_jobs",
            "Job placements read from c4.job.v1, by outcome (recorded, older, rejected; member:"
            " a rank's report, for the streams worker)",
            ["outcome"],
            registry=self.registry,
        )
        self.retries = Counter(
            "c4_action_retries",
            "Records retried after an outage or a busy claim, by cause (redis, kafka, busy)",
            ["cause"],
            registry=self.registry,
        )
        self.deadletters = Counter(
            "c4_action_deadletters",
            "Dead letters published, by source (diagnosis, job, webhook, a scheduler,"
            " alertmanager)",
            ["source"],
            registry=self.registry,
        )
        # Every source starts at 0, so a rate or an alert on it has a series before the first.
        for source in DEADLETTER_SOURCES:
            self.deadletters.labels(source)
        self.routes = Counter(
            "c4_action_routes",
            "Route messages published on c4.route.v1 by the reroute action",
            registry=self.registry,
        )
        self.plan_max_util = Gauge(
            "c4_action_plan_max_utilization_ratio",
            "Largest link utilisation (load / capacity) of the last plan this worker put in force",
            registry=self.registry,
        )
        self.plan_links = Gauge(
            "c4_plan_link_utilization_ratio",
            "Utilisation (load / capacity, the busier direction) of the busiest links of the last"
            f" plan this worker put in force (the top {PLAN_LINKS_EXPORTED})",
            ["link"],
            registry=self.registry,
        )
        self.processing = Histogram(
            "c4_action_processing_seconds",
            "Time to handle one diagnosis, actions and publication included",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=self.registry,
        )

    def record(self, actions: tuple[Action, ...]) -> None:
        """Count published action records."""
        for action in actions:
            reason = action.detail.get("reason")
            self.records.labels(action.action, action.status, str(reason or "")).inc()

    def record_plan(self, max_util: float, links: Mapping[str, float]) -> None:
        """The plan now in force: its largest utilisation and its busiest links."""
        self.plan_max_util.set(max_util)
        self.plan_links.clear()
        busiest = sorted(links.items(), key=lambda item: (-item[1], item[0]))
        for link, util in busiest[:PLAN_LINKS_EXPORTED]:
            self.plan_links.labels(link).set(util)

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve /metrics on ``address:port`` from a background thread."""
        start_http_server(port, addr=address, registry=self.registry)

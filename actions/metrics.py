"""Prometheus metrics of an action worker (its own registry, served on 127.0.0.1)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from schemas.messages import Action


class ActionMetrics:
    """Counters of what a worker consumed, decided and retried."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
            "Dead letters published, by source (diagnosis, job, webhook)",
            ["source"],
            registry=self.registry,
        )
        self.routes = Counter(
            "c4_action_routes",
            "Route messages published on c4.route.v1 by the reroute action",
            registry=self.registry,
        )
        self.plan_max_util = Gauge(
            "c4_action_plan_max_util",
            "max_util of the last plan this worker put in force",
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

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve /metrics on a background thread."""
        start_http_server(port, addr=address, registry=self.registry)

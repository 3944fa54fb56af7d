"""The engine: routes decoded v1 messages to the detectors and runs their event-time clock.

The same object serves the offline replay (`c4 diagnose`) and, fed from Kafka, the Faust
app: neither path has logic of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.base import C4Model
from schemas.files import Topology
from schemas.messages import Collective, Diagnosis, Gpu, Job, Link, Route
from streams.core.fabric import FabricCorrelator
from streams.core.hardware import HardwareMonitor
from streams.core.job import JobDetector
from streams.core.params import DetectorParams
from streams.core.places import PlacementIndex


class RouteBook:
    """The planned spine of each flow, from the ``c4.route.v1`` plans."""

    def __init__(self) -> None:
        self._via: dict[str, str | None] = {}

    def update(self, route: Route) -> None:
        """Record every path of one node's plan."""
        for path in route.paths:
            self._via[path.flow] = path.via

    def via(self, flow: str) -> str | None:
        """The spine of a flow, None when unplanned."""
        return self._via.get(flow)


class Engine:
    """Every detector of a cluster, fed in event time."""

    def __init__(
        self,
        params: DetectorParams | None = None,
        job_params: Mapping[str, Mapping[str, Any]] | None = None,
        topology: Topology | None = None,
    ) -> None:
        self.params = params or DetectorParams()
        self._job_params = {
            job: self.params.with_overrides(dict(o)) for job, o in (job_params or {}).items()
        }
        self.placements = PlacementIndex()
        self.routes = RouteBook()
        self.hardware = HardwareMonitor(
            self.params, self.placements.job_of_port, self.placements.job_of_gpu
        )
        self.fabric = FabricCorrelator(topology)
        self.jobs: dict[str, JobDetector] = {}
        self.now_ns = 0
        self._next_tick_ns = 0
        self.counts: dict[str, int] = {}

    def _job(self, job: str) -> JobDetector:
        detector = self.jobs.get(job)
        if detector is None:
            params = self._job_params.get(job, self.params)
            detector = JobDetector(
                job, params, self.hardware, self.routes, fabric_known=self.fabric.knows_paths
            )
            self.jobs[job] = detector
        return detector

    def process(self, message: C4Model) -> list[Diagnosis]:
        """Feed one message; returns the diagnoses that changed (firing or resolved)."""
        kind = type(message).__name__
        self.counts[kind] = self.counts.get(kind, 0) + 1
        out: list[Diagnosis] = []
        if isinstance(message, Collective):
            self._job(message.job).on_collective(message)
        elif isinstance(message, Link):
            out.extend(self.hardware.on_link(message))
        elif isinstance(message, Gpu):
            out.extend(self.hardware.on_gpu(message))
        elif isinstance(message, Job):
            self.placements.update(message)
            if message.state == "stopped":
                detector = self.jobs.pop(message.job, None)
                if detector is not None:
                    out.extend(detector.close(message.ts_ns))
            else:
                self._job(message.job).on_job(message)
        elif isinstance(message, Route):
            self.routes.update(message)
        ts_ns = getattr(message, "ts_ns", 0)
        out.extend(self.advance(ts_ns))
        return out

    def advance(self, now_ns: int) -> list[Diagnosis]:
        """Move the event-time clock forward (never back); run the timers when due."""
        if now_ns <= self.now_ns:
            return []
        self.now_ns = now_ns
        if now_ns < self._next_tick_ns:
            return []
        self._next_tick_ns = now_ns + self.params.tick_ns
        return self.check(now_ns)

    def check(self, now_ns: int) -> list[Diagnosis]:
        """Evaluate every detector at ``now_ns``."""
        out: list[Diagnosis] = []
        slow_paths = []
        for detector in self.jobs.values():
            out.extend(detector.check(now_ns))
            slow_paths.extend(detector.slow_paths)
        out.extend(self.hardware.check(now_ns))
        out.extend(self.fabric.check(now_ns, slow_paths))
        return out

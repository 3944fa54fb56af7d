"""The demo's simulated cluster, live: published paced in event time, following reroutes.

The simulator replays a scripted run. When the reroute action puts a new plan in force, the
fabric applies it: the flows whose path changed take the new path from that moment on. The
run is simulated again with those path changes (it is deterministic: every message up to the
change is the same) and publishing goes on after the messages already sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path as FilePath
from typing import Protocol

import redis

from actions.drivers.reroute.plan_store import PlanStore, PlanStoreError
from c4.settings import Settings
from planner.reroute import CurrentPlan
from producers.handoff import FolderSink
from producers.publisher import Publisher
from schemas.base import C4Model
from simulator.cluster import Cluster
from simulator.run import simulate_cluster
from simulator.scenario import PathChange, Scenario

NS_PER_S = 1_000_000_000
PLAN_CHECK_S = 0.5

PlanReader = Callable[[], CurrentPlan | None]


def store_reader(plans: PlanStore) -> PlanReader:
    """The plan in force in the store; None while Redis is away (a chaos kill, an outage):
    the simulated fabric keeps its paths meanwhile."""

    def current_plan() -> CurrentPlan | None:
        try:
            return plans.current()
        except (redis.RedisError, PlanStoreError):
            return None

    return current_plan


Path = tuple[str | None, str, str]  # via, source port, destination port


class Outlet(Protocol):
    """Where the simulated nodes' records go: Kafka directly, or a node agent's folder."""

    def publish(self, message: C4Model) -> None:
        """Hand one record on."""
        ...

    def flush(self, timeout_s: float = 60.0) -> None:
        """Make sure everything handed on is on its way."""
        ...


class HandoffOutlet:
    """The simulated nodes hand their records to a node agent (``c4 agent --handoff``).

    ``written`` tells, per file, how many bytes were handed over: what the chaos run
    compares with the agent's delivery checkpoint.
    """

    def __init__(self, folder: FilePath) -> None:
        self._sink = FolderSink(folder, "simulator")
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}

    def publish(self, message: C4Model) -> None:
        """Append the record to the handoff folder."""
        self._sink((message,))
        with self._lock:
            self._written[self._sink.path.name] = self._sink.size

    def written(self) -> dict[str, int]:
        """Bytes written so far, per file."""
        with self._lock:
            return dict(self._written)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Close the current file (every record is in the folder already)."""
        del timeout_s
        self._sink.close()


class LiveSimulator(threading.Thread):
    """Publishes the run, ``speed`` x real time, and applies each new plan in force."""

    def __init__(
        self,
        cluster: Cluster,
        scenario: Scenario,
        settings: Settings,
        speed: float,
        plans: PlanReader,
        outlet: Outlet | None = None,
    ) -> None:
        super().__init__(name="c4-demo-simulator", daemon=True)
        self._outlet = outlet
        self._cluster = cluster
        self.scenario = scenario
        self._settings = settings
        self._speed = speed
        self._plans = plans
        self._paths: dict[str, Path] = {
            f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}": (
                conn.via,
                str(conn.src_port),  # network(): never None
                str(conn.dst_port),
            )
            for job in cluster.jobs
            for comm in job.comms
            for conn in comm.network()
        }
        self._plan_id: str | None = None
        self.sent = 0
        self.event_ns = scenario.start_ns
        self.wall_start_ns: int | None = None  # when the run's first message went out
        self.applied: list[PathChange] = []
        self.error: str | None = None
        self._stop_event = threading.Event()

    def cancel(self) -> None:
        """Stop publishing at the next message."""
        self._stop_event.set()

    def run(self) -> None:
        publisher = self._outlet or Publisher(
            self._settings.kafka_client_config(), self._settings.topic_prefix
        )
        try:
            self._publish(publisher)
            publisher.flush(60)
        except Exception as error:  # noqa: BLE001 - reported by the demo as one line
            self.error = f"{type(error).__name__}: {error}"

    def _publish(self, publisher: Outlet) -> None:
        start_wall = time.monotonic()
        self.wall_start_ns = time.time_ns()
        start_ns = self.scenario.start_ns
        next_check = start_wall + PLAN_CHECK_S
        replanned = True
        while replanned:
            replanned = False
            # After a plan change: simulated again with the new paths, the same messages up
            # to now, so publishing goes on after those already sent.
            for message in self._messages(skip=self.sent):
                ts_ns = int(getattr(message, "ts_ns", start_ns))
                due = start_wall + (ts_ns - start_ns) / NS_PER_S / self._speed
                while (wait := due - time.monotonic()) > 0 and not replanned:
                    if self._stop_event.wait(min(wait, PLAN_CHECK_S)):
                        return
                    if time.monotonic() >= next_check:
                        next_check = time.monotonic() + PLAN_CHECK_S
                        elapsed_ns = int((time.monotonic() - start_wall) * self._speed * NS_PER_S)
                        replanned = self._follow_plan(start_ns + elapsed_ns)
                if replanned:
                    break
                if self._stop_event.is_set():
                    return
                publisher.publish(message)
                self.sent += 1
                self.event_ns = max(self.event_ns, ts_ns)

    def _messages(self, skip: int) -> Iterator[C4Model]:
        messages = simulate_cluster(self._cluster, self.scenario)
        for _ in range(skip):
            next(messages, None)
        return messages

    def _follow_plan(self, now_ns: int) -> bool:
        """Take a new plan in force as path changes from ``now_ns``; whether any changed."""
        current = self._plans()
        if current is None or current.id == self._plan_id:
            return False
        self._plan_id = current.id
        at_s = max(0.0, (now_ns - self.scenario.start_ns) / NS_PER_S)
        changes = []
        for path in current.plan.paths:
            known = self._paths.get(path.flow)
            if known is None:
                continue  # not a simulated connection: nothing to apply
            wanted: Path = (path.via, path.links[0], path.links[-1])
            if wanted != known:
                self._paths[path.flow] = wanted
                changes.append(
                    PathChange(
                        at_s=at_s,
                        flow=path.flow,
                        via=path.via,
                        src_port=path.links[0],
                        dst_port=path.links[-1],
                    )
                )
        if not changes:
            return False
        self.applied.extend(changes)
        self.scenario = self.scenario.model_copy(
            update={"path_changes": (*self.scenario.path_changes, *changes)}
        )
        return True

"""The agent's run: handoffs committed only after delivery, the drain at exit, the reports."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from producers.agent import Agent
from producers.agent_loop import RunLimits, run_agent
from producers.publisher import DeliveryCounts
from producers.sources import Reading
from schemas.base import C4Model
from schemas.messages import Collective, Ops

EMPTY = Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=())


class Clock:
    """Monotonic time that moves only when the run sleeps (in milliseconds, exactly)."""

    def __init__(self) -> None:
        self.ms = 0

    def now(self) -> float:
        return self.ms / 1000

    def sleep(self, seconds: float) -> None:
        self.ms += round(seconds * 1000)


class Beats:
    """One heartbeat a second; counts its rounds and whether it was closed."""

    name, interval_s = "beats", 1.0

    def __init__(self) -> None:
        self.rounds, self.closed = 0, False

    def read(self, now_ns: int) -> Reading:
        self.rounds += 1
        beat = Collective.of(
            job="j", comm="c", comm_size=1, rank=0, global_rank=0, ts_ns=now_ns, ops=EMPTY
        )
        return Reading(messages=[beat])

    def close(self) -> None:
        self.closed = True


@dataclass
class FakePublisher:
    """Records what the run asks of it; ``in_flight`` answers from a script."""

    events: list[str]
    in_flight_script: list[int]
    left_at_close: int = 0
    clock: Clock | None = None
    outage_at_s: float | None = None
    counts: DeliveryCounts = field(default_factory=DeliveryCounts)
    published: list[C4Model] = field(default_factory=list)
    down: bool = False

    def publish(self, message: C4Model) -> None:
        self.published.append(message)

    def service(self) -> None:
        if self.clock and self.outage_at_s is not None and self.clock.now() >= self.outage_at_s:
            self.down, self.counts.outages = True, 1

    def in_flight(self) -> int:
        return self.in_flight_script.pop(0) if self.in_flight_script else 0

    def close(self, timeout_s: float = 10.0) -> int:
        self.events.append(f"close {timeout_s}")
        return self.left_at_close


@dataclass
class FakeHandoff:
    events: list[str]
    name: str = "handoff"
    problem: str | None = None

    def commit(self) -> str | None:
        self.events.append("commit")
        return self.problem


def test_handoffs_are_committed_only_when_nothing_is_in_flight_and_after_the_close() -> None:
    clock, events, reports = Clock(), [], []
    source = Beats()
    publisher = FakePublisher(events, in_flight_script=[2, 0, 1, 0, 3, 3], left_at_close=4)
    agent = Agent([source], publisher.publish, reports.append, monotonic=clock.now)
    run_agent(
        agent,
        publisher,
        [FakeHandoff(events, problem="disk full")],
        reports.append,
        threading.Event(),
        RunLimits(duration_s=0.45, drain_s=2.5),
        monotonic=clock.now,
        sleep=clock.sleep,
    )
    assert source.rounds == 1 and len(publisher.published) == 1 and source.closed
    # Steps at 0, 0.1 ... 0.5 s (the last one) see 2, 0, 1, 0, 3, 3 in flight: two commits.
    assert events == ["commit", "commit", "close 2.5", "commit"]
    assert reports.count("source handoff: disk full") == 3
    assert reports[-1].endswith("; 4 not yet delivered (kept in the spool)")
    assert reports[-1].startswith("delivered 0, failed 0, outages 0, spooled 0")


def test_a_stop_ends_the_run_and_it_still_drains_and_commits() -> None:
    clock, events, reports = Clock(), [], []
    stop = threading.Event()
    source = Beats()
    publisher = FakePublisher(events, in_flight_script=[1] * 100)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.ms >= 300:
            stop.set()  # as the SIGTERM handler would

    agent = Agent([source], publisher.publish, reports.append, monotonic=clock.now)
    run_agent(
        agent,
        publisher,
        [FakeHandoff(events)],
        reports.append,
        stop,
        monotonic=clock.now,
        sleep=sleep,
    )
    assert clock.ms == 300 and source.closed
    assert events == ["close 10.0", "commit"]  # never idle before: committed only at exit


def test_once_runs_every_source_one_round_and_without_a_publisher_commits_nothing() -> None:
    events: list[str] = []
    reports: list[str] = []
    printed: list[C4Model] = []
    source = Beats()
    agent = Agent([source], printed.append, reports.append)
    run_agent(
        agent, None, [FakeHandoff(events)], reports.append, threading.Event(), RunLimits(once=True)
    )
    assert source.rounds == 1 and len(printed) == 1 and source.closed
    assert reports == ["1 messages from beats"]
    assert events == []


def test_an_outage_is_reported_within_seconds_the_rest_once_a_minute() -> None:
    clock, events = Clock(), []
    said: list[tuple[int, str]] = []
    publisher = FakePublisher(events, in_flight_script=[], clock=clock, outage_at_s=2.0)
    agent = Agent([Beats()], publisher.publish, print, monotonic=clock.now)
    run_agent(
        agent,
        publisher,
        [],
        lambda line: said.append((clock.ms, line)),
        threading.Event(),
        RunLimits(duration_s=130.0),
        monotonic=clock.now,
        sleep=clock.sleep,
    )
    times = [ms for ms, _ in said[:-1]]
    assert times == [5_000, 65_000, 125_000]  # trouble after 5 s at most, then every minute
    assert all(
        "outages 1" in line and line.endswith("(broker unreachable)") for _, line in said[:-1]
    )
    assert said[-1][1].endswith("0 not yet delivered (kept in the spool)")

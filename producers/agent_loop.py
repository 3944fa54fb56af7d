"""The node agent's run: its sources on their intervals until told to stop, then the drain.

Messages go to the publisher (or any sink given to the `Agent`). Handoff read positions are
committed only while nothing is in flight, so everything read so far is acknowledged by the
broker or in the disk spool; at exit once more, after the publisher has put what it still
held back in the spool: a restarted agent reads again at most what it had not handed on.
Delivery counts are reported once a minute; outages and drops at once (at most every
``TROUBLE_EVERY_S``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from producers.agent import Agent
from producers.handoff import HandoffSource
from producers.publisher import DeliveryCounts, Publisher
from producers.sources import Source
from producers.spool import DiskSpool
from schemas.base import C4Model

REPORT_EVERY_S = 60.0
TROUBLE_EVERY_S = 5.0
HANDOFF_STATE_FILE = "handoff-offsets.json"
MAX_SLEEP_S = 0.1  # how long a stop or a delivery report may wait between steps


class Publishing(Protocol):
    """What the run needs of a publisher (`Publisher`)."""

    counts: DeliveryCounts

    @property
    def down(self) -> bool: ...

    def publish(self, message: C4Model) -> None: ...

    def service(self) -> None: ...

    def in_flight(self) -> int: ...

    def close(self, timeout_s: float = 10.0) -> int: ...


class Committing(Protocol):
    """A source whose read positions are committed once what it gave is delivered."""

    name: str

    def commit(self) -> str | None: ...


class Stopping(Protocol):
    """Set when the run is to end (a `threading.Event`)."""

    def is_set(self) -> bool: ...


def handoff_state_beside(spool_dir: Path) -> Path:
    """Where the handoff read positions are kept by default: beside the spool, so that a
    restarted agent goes on where it was."""
    return spool_dir / HANDOFF_STATE_FILE


def spooling_publisher(
    client_config: Mapping[str, Any], topic_prefix: str, spool_dir: Path, max_bytes: int
) -> Publisher:
    """A publisher that spools to ``spool_dir`` while the broker is away (a SpoolError when
    the folder cannot be used)."""
    return Publisher(client_config, topic_prefix, DiskSpool(spool_dir, max_bytes=max_bytes))


def handoffs_of(sources: Iterable[Source]) -> list[HandoffSource]:
    """The sources whose read positions are committed after delivery."""
    return [source for source in sources if isinstance(source, HandoffSource)]


def summary(counts: DeliveryCounts) -> str:
    """The delivery counts as one report line."""
    return (
        f"delivered {counts.delivered}, failed {counts.failed}, outages {counts.outages}, "
        f"spooled {counts.spooled}, replayed {counts.replayed}, "
        f"dropped heartbeats {counts.dropped_heartbeats}, dropped others {counts.dropped_records}"
    )


@dataclass(frozen=True, slots=True)
class RunLimits:
    """``once``: one round of every source; ``duration_s``: stop after this long;
    ``drain_s``: how long the exit waits for deliveries."""

    once: bool = False
    duration_s: float | None = None
    drain_s: float = 10.0


def run_agent(
    agent: Agent,
    publisher: Publishing | None,
    handoffs: Sequence[Committing],
    report: Callable[[str], None],
    stop: Stopping,
    limits: RunLimits = RunLimits(),  # noqa: B008 -- frozen: one shared default is safe
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Run ``agent`` until ``stop`` is set or the limits end it; then close its sources,
    drain and close ``publisher`` and commit the handoffs. Without a publisher (the agent's
    sink prints), nothing is committed or counted."""
    started = last_report = monotonic()
    last_trouble = (0, 0, 0)
    try:
        while not stop.is_set():
            if limits.once:
                count = agent.run_once()
                report(f"{count} messages from {', '.join(agent.active) or 'no source'}")
                break
            wait = agent.step()
            now = monotonic()
            if publisher is not None:
                publisher.service()
                if publisher.in_flight() == 0:
                    # Everything read so far is acknowledged or in the spool.
                    _commit(handoffs, report)
                counts = publisher.counts
                trouble = (counts.outages, counts.dropped_heartbeats, counts.dropped_records)
                if now - last_report >= REPORT_EVERY_S or (
                    trouble != last_trouble and now - last_report >= TROUBLE_EVERY_S
                ):
                    report(summary(counts) + (" (broker unreachable)" if publisher.down else ""))
                    last_report, last_trouble = now, trouble
            if limits.duration_s and now - started >= limits.duration_s:
                break
            sleep(min(wait, MAX_SLEEP_S))
    finally:
        agent.close()
        if publisher is not None:
            left = publisher.close(limits.drain_s)
            _commit(handoffs, report)  # what was not delivered is in the spool now
            report(f"{summary(publisher.counts)}; {left} not yet delivered (kept in the spool)")


def _commit(handoffs: Sequence[Committing], report: Callable[[str], None]) -> None:
    for handoff in handoffs:
        problem = handoff.commit()
        if problem is not None:
            report(f"source {handoff.name}: {problem}")

"""The node agent: runs every configured source on its own interval, hands messages on.

A source that is unavailable is reported once and left out; a source whose round fails is
reported once when it starts failing and once when it recovers, and tried every interval
in between; partial problems (one bad file) are reported once each. The agent never stops
because of a source.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from producers.batching import pack_round
from producers.sources import Reading, Source, SourceUnavailable
from schemas.base import C4Model
from schemas.messages import Collective, Collectives

MAX_REMEMBERED_PROBLEMS = 10_000  # distinct problem lines; past it, old ones may repeat


@dataclass(slots=True)
class _Scheduled:
    source: Source
    due: float
    unavailable: bool = False
    failing: bool = False
    # Job -> when (monotonic) this source last had collective messages of it from this node.
    jobs: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class AgentCounts:
    """Rounds run, messages handed on (a batch counting its messages), and failures."""

    rounds: int = 0
    messages: int = 0
    failed_rounds: int = 0
    problems: int = 0
    per_source: dict[str, int] = field(default_factory=dict)


class Agent:
    """Schedules sources; every message goes to ``sink``, every report line to ``report``.

    With ``pack``, the collective messages of one source round (one interval of this node)
    go to ``sink`` as one ``collectives`` batch per job (``node`` names the node in them),
    its link messages as one ``links`` batch and its GPU messages as one ``gpus`` batch
    (each named by its messages' node), every batch where its first message was. Off by
    default: two streams workers sharing a topic of batch records stopped
    taking records after a rebalance in about 4 of 10 runs here (one record per message:
    none in 6); see docs/guarantees.md.

    With a ``node`` and ``presence_s``, a round of a source that had a job's collective
    messages from this node within the last ``presence_s`` seconds, but none now, sends an
    empty ``collectives`` batch naming the node (its presence): the ranks of the job on
    this node went silent while the node is up, so the detectors name those ranks (a hang),
    not the node (down).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        sink: Callable[[C4Model], None],
        report: Callable[[str], None],
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        pack: bool = False,
        node: str | None = None,
        presence_s: float = 0.0,
    ) -> None:
        now = monotonic()
        self._scheduled = [_Scheduled(source, now) for source in sources]
        self._sink, self._report = sink, report
        self._clock_ns, self._monotonic = clock_ns, monotonic
        self._seen_problems: set[str] = set()
        self._pack, self._node = pack, node
        self._presence_s = presence_s
        self.counts = AgentCounts()

    @property
    def active(self) -> list[str]:
        """Names of the sources still run (not unavailable)."""
        return [item.source.name for item in self._scheduled if not item.unavailable]

    def run_once(self) -> int:
        """Run every available source once now; the number of messages handed on."""
        return sum(self._run(item) for item in self._scheduled if not item.unavailable)

    def step(self) -> float:
        """Run the sources that are due; the seconds until the next one is."""
        now = self._monotonic()
        for item in self._scheduled:
            if not item.unavailable and item.due <= now:
                self._run(item)
                # Keep the cadence; after a long stall, start again from now.
                item.due = max(item.due + item.source.interval_s, now)
        waiting = [item.due for item in self._scheduled if not item.unavailable]
        return max(0.0, min(waiting) - self._monotonic()) if waiting else 1.0

    def _run(self, item: _Scheduled) -> int:
        source = item.source
        self.counts.rounds += 1
        try:
            reading: Reading = source.read(self._clock_ns())
        except SourceUnavailable as error:
            item.unavailable = True
            self._report(f"source {source.name}: unavailable ({error}); the agent goes on")
            return 0
        except Exception as error:  # noqa: BLE001 -- a source must never stop the agent
            self.counts.failed_rounds += 1
            if not item.failing:
                item.failing = True
                self._report(f"source {source.name}: failed ({type(error).__name__}: {error})")
            return 0
        if item.failing:
            item.failing = False
            self._report(f"source {source.name}: recovered")
        for problem in reading.problems:
            self.counts.problems += 1
            if problem not in self._seen_problems:
                if len(self._seen_problems) >= MAX_REMEMBERED_PROBLEMS:
                    self._seen_problems.clear()
                self._seen_problems.add(problem)
                self._report(f"source {source.name}: {problem}")
        out = pack_round(reading.messages, self._node) if self._pack else reading.messages
        if self._node is not None and self._presence_s > 0:
            out = [*out, *self._presence(item, reading.messages, self._node)]
        for message in out:
            self._sink(message)
        sent = len(reading.messages)
        self.counts.messages += sent
        self.counts.per_source[source.name] = self.counts.per_source.get(source.name, 0) + sent
        return sent

    def _presence(
        self, item: _Scheduled, messages: Sequence[C4Model], node: str
    ) -> list[Collectives]:
        """Empty batches for the jobs of this node that the source had lately, not now."""
        now = self._monotonic()
        here = {
            message.job
            for message in messages
            if isinstance(message, Collective | Collectives) and message.node in (None, node)
        }
        for job in here:
            item.jobs[job] = now
        present: list[Collectives] = []
        for job, last in list(item.jobs.items()):
            if job in here:
                continue
            if now - last > self._presence_s:
                del item.jobs[job]  # long gone from this node: no more presence for it
                continue
            present.append(
                Collectives(
                    v=1, kind="collectives", job=job, node=node, ts_ns=self._clock_ns(), messages=()
                )
            )
        return present

    def close(self) -> None:
        """Close every source."""
        for item in self._scheduled:
            try:
                item.source.close()
            except Exception as error:  # noqa: BLE001 -- closing must reach every source
                self._report(f"source {item.source.name}: close failed ({error})")

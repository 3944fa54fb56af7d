"""When the stages on Kafka meet, and the job stage's gate over what node stages hand on.

Spread over Kafka (issue 34), one job's collective reports go from their job-keyed
partition to node stages on other partitions (keyed by job and node), and what those hand
on comes back to the job stage on a job-keyed topic. Kafka orders records only within a
partition, so the stages meet on barriers numbered by event time:

- the forwarder, which reads a job's reports in their partition's order, marks a barrier
  into every node-stage partition whenever a report's event time enters a new tick
  (`BarrierMarks`): before that report, as the replay's stages meet before the message
  whose time makes a check due. A barrier's number is its tick (``ts_ns // tick_ns``), so a
  forwarder restarted from its last commit marks the same numbers again;
- each node stage hands on, at a mark, what it took of the job since its last one, numbered
  by its partition (its *source*) and the barrier, also when it took nothing: that is its
  watermark;
- the job stage applies a barrier once every source's watermark passed it (`ShareGate`),
  the barriers in order, and drops a share of a barrier it applied already (a source that
  restarted and handed it on again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.core.comm import NOT_YET
from streams.core.split import JobShare

NO_BARRIER = -1


def barrier_at(ts_ns: int, tick_ns: int) -> int:
    """The number of the barrier an event time falls after: its tick."""
    return ts_ns // tick_ns


class BarrierMarks:
    """The forwarder's side: per job, the latest barrier marked."""

    def __init__(self, tick_ns: int) -> None:
        if tick_ns <= 0:
            message = f"a barrier's tick must be positive, not {tick_ns} ns"
            raise ValueError(message)
        self.tick_ns = tick_ns
        self._marked: dict[str, int] = {}

    def due(self, job: str, ts_ns: int) -> int | None:
        """The barrier to mark before a report of ``job`` at ``ts_ns`` (None: none). The
        job's first report marks none: nothing came before it."""
        barrier = barrier_at(ts_ns, self.tick_ns)
        marked = self._marked.get(job)
        if marked is None:
            self._marked[job] = barrier
            return None
        if barrier <= marked:
            return None
        self._marked[job] = barrier
        return barrier

    def next(self, job: str) -> int | None:
        """The barrier to mark after ``job``'s reports went silent (None: none marked yet):
        the one after the latest. Its number is no tick, so a report of that tick comes in
        the barrier after it; numbers only have to grow."""
        marked = self._marked.get(job)
        if marked is None:
            return None
        self._marked[job] = marked + 1
        return marked + 1

    def forget(self, job: str) -> None:
        """The job stopped: its next report starts its barriers again."""
        self._marked.pop(job, None)


@dataclass(frozen=True, slots=True)
class Barrier:
    """A barrier the job stage may apply: every source's share of it, and the latest event
    time among them (`NOT_YET`: none)."""

    job: str
    number: int
    shares: tuple[JobShare, ...]
    latest_ns: int


@dataclass(slots=True)
class _Waiting:
    """A barrier some sources handed on: the sources it was marked into (whose shares it
    waits for) and, per source, its share and the latest event time of it."""

    expected: set[int] = field(default_factory=set)
    handed: dict[int, tuple[JobShare | None, int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Gated:
    applied: int = NO_BARRIER
    passed: dict[int, int] = field(default_factory=dict)  # source -> latest barrier handed on
    waiting: dict[int, _Waiting] = field(default_factory=dict)  # barrier -> what came of it


class ShareGate:
    """The job stage's side: shares held until every source a barrier was marked into
    passed it (of ``sources`` node-stage partitions)."""

    def __init__(self, sources: int) -> None:
        if sources < 1:
            message = f"a gate needs at least one source, not {sources}"
            raise ValueError(message)
        self.sources = sources
        self._jobs: dict[str, _Gated] = {}
        self.duplicates = 0  # shares dropped as handed on before

    def offer(
        self,
        job: str,
        source: int,
        barrier: int,
        share: JobShare | None,
        latest_ns: int,
        marked: tuple[int, ...] | None = None,
    ) -> list[Barrier]:
        """One source's share of a barrier (None: it took nothing of the job), and the
        sources the barrier was marked into (None: every one); the barriers that
        completes, in order.

        A barrier is marked only into the partitions the job's reports went to, so a small
        job's barriers wait for its few partitions, not for every one. The sources a
        barrier waits for are all those any of its shares named (a forwarder restarted
        from its last commit marks a barrier again, with at least the sources it named
        before). A later barrier never names fewer sources, and a source hands its
        barriers on in order, so once each source of a barrier passed it, every barrier
        before it is in too."""
        if not 0 <= source < self.sources:
            message = f"share from source {source}: the gate has sources 0 to {self.sources - 1}"
            raise ValueError(message)
        if marked is not None and any(not 0 <= each < self.sources for each in marked):
            message = f"a barrier marked into {marked}: sources are 0 to {self.sources - 1}"
            raise ValueError(message)
        gated = self._jobs.get(job)
        if gated is None:
            gated = self._jobs[job] = _Gated()
        if barrier <= gated.applied or barrier <= gated.passed.get(source, NO_BARRIER):
            self.duplicates += 1
            return []
        gated.passed[source] = barrier
        waiting = gated.waiting.get(barrier)
        if waiting is None:
            waiting = gated.waiting[barrier] = _Waiting()
        waiting.expected.update(range(self.sources) if marked is None else marked)
        waiting.expected.add(source)
        waiting.handed[source] = (share, latest_ns)
        out: list[Barrier] = []
        passed = gated.passed
        for number in sorted(gated.waiting):
            waiting = gated.waiting[number]
            if any(passed.get(each, NO_BARRIER) < number for each in waiting.expected):
                break
            del gated.waiting[number]
            handed = waiting.handed
            shares = tuple(share for _, (share, _ns) in sorted(handed.items()) if share is not None)
            latest = max((ns for _, ns in handed.values()), default=NOT_YET)
            out.append(Barrier(job, number, shares, latest))
            gated.applied = number
        return out

    def applied(self, job: str) -> int:
        """The latest barrier of ``job`` let through (`NO_BARRIER`: none)."""
        gated = self._jobs.get(job)
        return NO_BARRIER if gated is None else gated.applied

    def restore(self, job: str, applied: int) -> None:
        """A job taken over from its snapshot, which holds barriers up to ``applied``: what
        comes of those again is dropped."""
        gated = self._jobs.get(job)
        if gated is None:
            gated = self._jobs[job] = _Gated()
        gated.applied = max(gated.applied, applied)

    def forget(self, job: str) -> None:
        """The job's state went (revoked, stopped): nothing of it waits here any more."""
        self._jobs.pop(job, None)

    def jobs(self) -> list[str]:
        """The jobs the gate holds."""
        return list(self._jobs)

"""Live: a job's collectives wait for its nodes' link reports, so both are read in event time.

Whether a slow connection is its port's fault (the port's counters show errors) or its
path's (a fabric link: a slow path for the correlator) is read from the link reports. A
replay has them up to the time it judges; a live worker reads the link topic and the
collective topic in whatever order the broker and its CPU allow, and under load one can
trail the other by many seconds. Judged then, a degraded port looks healthy: its
connections go to the correlator as slow paths (a false fabric finding) and the port's own
finding is missed. Holding the job's checks is not enough: its state moves on with its
data (a node of it goes down, its slowdown resolves) and the moment is gone.

So, as Kafka Streams aligns a task's partitions by timestamp, a collective report waits
while a node of its job has link reports that trail it by more than
``LINK_REPORTS_SLACK_NS`` and that node's link partition is behind (more of its reports are
still to be read); once they are read, or nothing more can come, the job's reports go on in
their order. A node whose ranks stopped reporting in the job's data (for ``silent_ns``) is
not waited for: it is down, its agent too. Every wait ends once the partitions it waits on
are read to their end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from schemas.messages import Collective

# A report interval of the link counters (1 s) and then some: within it a node's reports
# are as recent as the job's, and in steady state nothing ever waits.
LINK_REPORTS_SLACK_NS = 2_000_000_000
# Reports one job may hold back; past it the oldest goes on (memory stays bounded).
MAX_WAITING = 65_536
_NEVER = -(1 << 62)


class LinkProgress(Protocol):
    """Which nodes' link reports may still come (``streams.core.engine.InputProgress``)."""

    def hardware_behind(self) -> bool:
        """Some node's link reports may still come."""
        ...

    def hardware_pending(self, node: str) -> bool:
        """A node's link reports may still come that are older than the data seen."""
        ...


class LinkAlignment:
    """The collective reports each job holds back until its nodes' link reports caught up."""

    def __init__(
        self,
        progress: LinkProgress | None,
        node_reported_at: Callable[[str], int | None],
        silent_ns: int,
    ) -> None:
        self._progress = progress
        self._reported_at = node_reported_at
        self._silent_ns = silent_ns
        self.waiting: dict[str, deque[Collective]] = {}
        # job -> node -> the latest report of a rank of the job on it (as it arrived)
        self._nodes: dict[str, dict[str, int]] = {}
        # job -> up to when its reports need not wait (a lower bound: link reports only
        # raise it), until the next ``refresh``
        self._clear_until: dict[str, int] = {}

    def holds(self, message: Collective) -> bool:
        """Whether the report waits (it is kept, in order); False: process it now."""
        if self._progress is None:
            return False  # a replay reads every input in event time
        job = message.job
        if message.node is not None:
            self._seen(job, message.node, message.ts_ns)
        queue = self.waiting.get(job)
        if queue:
            queue.append(message)  # behind others of its job: in their order
            return True
        if not self._trails(job, message.ts_ns):
            return False
        self.waiting[job] = deque((message,))
        return True

    def _seen(self, job: str, node: str, ts_ns: int) -> None:
        nodes = self._nodes.get(job)
        if nodes is None:
            nodes = self._nodes[job] = {}
        last = nodes.get(node)
        if last is None:
            self._clear_until.pop(job, None)  # a node more may trail: asked anew
        if last is None or ts_ns > last:
            nodes[node] = ts_ns

    def refresh(self) -> None:
        """Which partitions are behind was measured again: what was cleared is asked anew."""
        self._clear_until.clear()

    def ready(self) -> Iterator[Collective]:
        """The held reports that need not wait any more, each job's in order."""
        for job in list(self.waiting):
            queue = self.waiting[job]
            while queue and (len(queue) > MAX_WAITING or not self._trails(job, queue[0].ts_ns)):
                yield queue.popleft()
            if not queue:
                del self.waiting[job]

    def release(self, job: str) -> list[Collective]:
        """Every report the job holds back (a fact about the job comes: they go first)."""
        queue = self.waiting.pop(job, None)
        return list(queue) if queue else []

    def forget(self, job: str) -> list[Collective]:
        """The job is gone from here (a partition moved, the job stopped): its held reports,
        for its snapshot, and its nodes."""
        self._nodes.pop(job, None)
        self._clear_until.pop(job, None)
        return self.release(job)

    def held_of(self, job: str) -> list[Collective]:
        """The reports the job holds back now, oldest first."""
        return list(self.waiting.get(job, ()))

    def hold(self, job: str, messages: list[Collective]) -> None:
        """Hold these reports of a job again (restored from its snapshot)."""
        if messages:
            self.waiting.setdefault(job, deque()).extend(messages)
            for message in messages:
                if message.node is not None:
                    self._seen(job, message.node, message.ts_ns)

    def _trails(self, job: str, ts_ns: int) -> bool:
        """Some node of the job has link reports that trail ``ts_ns`` and may still come."""
        progress = self._progress
        if progress is None or not progress.hardware_behind():
            return False
        if ts_ns <= self._clear_until.get(job, _NEVER):
            return False
        clear = 1 << 62
        nodes = self._nodes.get(job, {})
        # Silent against the job's latest report seen, held ones too: a node that stopped
        # reporting stays silent however long the held reports wait.
        quiet = max(nodes.values(), default=ts_ns) - self._silent_ns
        for node, last in nodes.items():
            if last < quiet:
                continue  # its ranks stopped reporting: down, its agent too
            reported = self._reported_at(node)
            bound = _NEVER if reported is None else reported + LINK_REPORTS_SLACK_NS
            if bound < clear and progress.hardware_pending(node):
                clear = bound
        self._clear_until[job] = clear
        return ts_ns > clear

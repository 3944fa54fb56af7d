"""Live: collective reports wait for their nodes' link reports, so both are read in event time.

Whether a slow connection is its port's fault (the port's counters show errors) or its
path's (a fabric link: a slow path for the correlator) is read from the link reports. A
replay has them up to the time it judges; a live worker reads the link topic and the
collective topic in whatever order the broker and its CPU allow, and under load one can
trail the other by many seconds. Judged then, a degraded port looks healthy: its
connections go to the correlator as slow paths (a false fabric finding) and the port's own
finding is missed. Holding the job's checks is not enough: its state moves on with its
data (a node of it goes down, its slowdown resolves) and the moment is gone.

So, as Kafka Streams aligns a task's partitions by timestamp, collective reports wait while
a node they came from has link reports that trail them by more than
``LINK_REPORTS_SLACK_NS`` and that node's link partition is behind (more of its reports are
still to be read); once they are read, or nothing more can come, the reports go on in the
order they came. All jobs wait together, not only those of the trailing node: the fabric
correlator joins every job's slow paths at one time, and a job held back alone would show
it paths of seconds ago beside the others' paths of now (a tie, a neighbouring link named).
A node whose ranks stopped reporting (for ``silent_ns``) is not waited for: it is down, its
agent too. Every wait ends once the partitions it waits on are read to their end.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from schemas.messages import Collective

# A report interval of the link counters (1 s) and then some: within it a node's reports
# are as recent as the job's, and in steady state nothing ever waits.
LINK_REPORTS_SLACK_NS = 2_000_000_000
# Reports held back at most, of all jobs; past it the oldest goes on (memory stays bounded).
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
    """The collective reports held back until the link reports of their nodes caught up."""

    def __init__(
        self,
        progress: LinkProgress | None,
        node_reported_at: Callable[[str], int | None],
        silent_ns: int,
    ) -> None:
        self._progress = progress
        self._reported_at = node_reported_at
        self._silent_ns = silent_ns
        self._queue: deque[Collective] = deque()  # in the order they came
        # id of a held report -> its snapshot dump, made once however many snapshots it
        # waits through (a drain that outruns its link reports holds thousands); gone
        # when the report leaves the queue, so an id is never another report's.
        self._dumps: dict[int, Any] = {}
        self.waiting: dict[str, int] = {}  # job -> how many of its reports wait
        self._nodes: dict[str, int] = {}  # node -> the latest report of a rank on it
        self.latest_ns = _NEVER  # the latest report seen (live), held or not
        # Up to when reports need not wait (a lower bound: link reports only raise it),
        # until the next ``refresh`` or a node not seen before.
        self._clear_until = _NEVER

    def holds(self, message: Collective) -> bool:
        """Whether the report waits (it is kept, in order); False: process it now."""
        if self._progress is None:
            return False  # a replay reads every input in event time
        ts_ns = message.ts_ns
        if ts_ns > self.latest_ns:
            self.latest_ns = ts_ns
        node = message.node
        if node is not None:
            last = self._nodes.get(node)
            if last is None:
                self._clear_until = _NEVER  # a node more may trail: asked anew
            if last is None or ts_ns > last:
                self._nodes[node] = ts_ns
        if not self._queue and not self._trails(ts_ns):
            return False
        self._queue.append(message)  # behind the others that wait: in their order
        self.waiting[message.job] = self.waiting.get(message.job, 0) + 1
        return True

    def refresh(self) -> None:
        """Which partitions are behind was measured again: what was cleared is asked anew."""
        self._clear_until = _NEVER

    def ready(self) -> Iterator[Collective]:
        """The held reports that need not wait any more, in the order they came."""
        queue = self._queue
        while queue and (len(queue) > MAX_WAITING or not self._trails(queue[0].ts_ns)):
            message = queue.popleft()
            self._dumps.pop(id(message), None)
            self._count_out(message.job)
            yield message

    def release(self, job: str) -> list[Collective]:
        """Every report of the job held back (a fact about the job comes: they go first)."""
        if job not in self.waiting:
            return []
        mine = [message for message in self._queue if message.job == job]
        self._queue = deque(message for message in self._queue if message.job != job)
        del self.waiting[job]
        for message in mine:
            self._dumps.pop(id(message), None)
        return mine

    def held_dumps(self, job: str, dump: Callable[[Collective], Any]) -> list[Any]:
        """``dump`` of each report of the job held back now, oldest first (its snapshot);
        each report dumped once while it waits."""
        if job not in self.waiting:
            return []
        dumps, found = self._dumps, []
        for message in self._queue:
            if message.job == job:
                known = dumps.get(id(message))
                if known is None:
                    known = dumps[id(message)] = dump(message)
                found.append(known)
        return found

    def hold(self, job: str, messages: list[Collective]) -> None:
        """Hold these reports of a job again (restored from its snapshot)."""
        for message in messages:
            self._queue.append(message)
            self.waiting[job] = self.waiting.get(job, 0) + 1
            self.latest_ns = max(self.latest_ns, message.ts_ns)
            if message.node is not None and message.ts_ns > self._nodes.get(message.node, _NEVER):
                self._nodes[message.node] = message.ts_ns
                self._clear_until = _NEVER

    def _count_out(self, job: str) -> None:
        left = self.waiting[job] - 1
        if left:
            self.waiting[job] = left
        else:
            del self.waiting[job]

    def _trails(self, ts_ns: int) -> bool:
        """Some node has link reports that trail ``ts_ns`` and may still come."""
        progress = self._progress
        if progress is None or not progress.hardware_behind():
            return False
        if ts_ns <= self._clear_until:
            return False
        clear = 1 << 62
        # Silent against the latest report seen, held ones too: a node that stopped
        # reporting stays silent however long the held reports wait.
        quiet = self.latest_ns - self._silent_ns
        for node, last in self._nodes.items():
            if last < quiet:
                continue  # its ranks stopped reporting: down, its agent too
            reported = self._reported_at(node)
            bound = _NEVER if reported is None else reported + LINK_REPORTS_SLACK_NS
            if bound < clear and progress.hardware_pending(node):
                clear = bound
        self._clear_until = clear
        return ts_ns > clear

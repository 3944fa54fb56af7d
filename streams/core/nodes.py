"""Node liveness within a job: a node silent while the job's others report is down.

Silent means its ranks stopped reporting and its agent did too. An agent that still says
it is up (a ``collectives`` batch naming the node, empty when the ranks said nothing) while
the node's ranks are silent shows processes stopped on a live node: no node_down, and the
hang check names those ranks.

A rank counts as seen when the other members of one of its communicators finish an
operation (`CommTracker.finished_ns`): it took part in it, so its node was up then, whatever
its own reports say so far. Each node's agent spools and replays on its own (after a broker
outage the job's partition holds one node's backlog before another's): a node whose reports
are behind the others' is not silent while its peers' operations go on completing, and one
that went down stops them, so it is still found ``silent_after`` past the last of them.
"""

from __future__ import annotations

from schemas.messages import Diagnosis
from streams.core.findings import FindingBook, SuspectScore
from streams.core.groups import JobGroups
from streams.core.params import DetectorParams


class NodeWatch:
    """Fires and resolves a job's ``node_down`` findings from when its nodes last reported."""

    def __init__(self, groups: JobGroups, params: DetectorParams, book: FindingBook) -> None:
        self._groups = groups
        self._params = params
        self._book = book
        # Nodes whose node_down just resolved -> when: their ranks report again one by one,
        # and those not yet back must not read as a new hang meanwhile.
        self.back_ns: dict[str, int] = {}
        # The job's latest report time. After a gap in which none of its nodes reported
        # (the data path stopped: agents or broker away, records skipped, a restore from a
        # snapshot older than the offsets the worker goes on from), the first report is no
        # sign that the other nodes are gone: until each reports again they count as seen
        # at that report (``_seen_floor``), and one silent for ``silent_after`` past it is.
        self._data_ns = -1
        self._seen_floor: tuple[int, frozenset[str]] | None = None
        # Node -> when its agent last said it was up (event time).
        self.agents_ns: dict[str, int] = {}

    def on_agent(self, node: str, ts_ns: int) -> None:
        """The node's agent was up at ``ts_ns``."""
        if ts_ns > self.agents_ns.get(node, -1):
            self.agents_ns[node] = ts_ns

    def on_report(self, ts_ns: int) -> None:
        """A report of the job at ``ts_ns``, before its group takes it."""
        if ts_ns > self._data_ns:
            if self._data_ns >= 0 and ts_ns - self._data_ns > self._params.silent_after_ns:
                self._resume_after_gap(ts_ns)
            self._data_ns = ts_ns

    def last_seen(self) -> dict[str, int]:
        """Each node of the job -> when it was last seen up (event time): its latest report,
        or a later operation its ranks took part in that a peer finished."""
        seen: dict[str, int] = {}
        place = self._groups.place
        for tracker in self._groups.comms.values():
            finished = tracker.finished_ns
            # Per node its members named, then each member that never named its node (the
            # job's placement may): a check reads nodes, not every member of every group.
            for node, last in tracker.seen_by_node.items():
                at = last if last > finished else finished
                if at > seen.get(node, -1):
                    seen[node] = at
            for rank in tracker.nodeless:
                member = tracker.members[rank]
                placed, _, _ = place(member)
                # A member never heard from stays out: nothing says where it stands.
                if placed is not None and member.last_seen_ns >= 0:
                    at = max(member.last_seen_ns, finished)
                    seen[placed] = max(seen.get(placed, -1), at)
        if self._seen_floor is not None:
            floor, nodes = self._seen_floor
            for node in seen.keys() & nodes:  # a set (frozenset & keys is one too)
                seen[node] = max(seen[node], floor)
        return seen

    def _resume_after_gap(self, ts_ns: int) -> None:
        """The first report after the whole job was silent: a gap is no node's silence."""
        down = set(self._book.open_keys(self._groups.job, "node_down"))
        nodes = frozenset(node for node in self.last_seen() if node not in down)
        self._seen_floor = (ts_ns, nodes)

    def check(self, now_ns: int, out: list[Diagnosis]) -> set[str]:
        """Fire and resolve node_down at ``now_ns``; the nodes down now."""
        job = self._groups.job
        seen = self.last_seen()
        cutoff = now_ns - self._params.silent_after_ns
        alive = [node for node, ts in seen.items() if ts >= cutoff]
        # Gone means silent while the others went on reporting for as long: when every
        # node stops together (the job ended, the data stopped) none of them is down.
        latest = max(seen.values(), default=-1)
        down = {
            node
            for node, ts in seen.items()
            if ts < cutoff
            and ts < latest - self._params.silent_after_ns
            and self.agents_ns.get(node, -1) < cutoff
        }
        for node in sorted(down):
            fired = self._book.fire(
                job,
                "node_down",
                node,
                seen[node],
                now_ns,
                (SuspectScore("node", node, 0.95),),
                {"last_seen_ns": seen[node], "nodes_alive": len(alive)},
            )
            if fired:
                out.append(fired)
        for node in self._book.open_keys(job, "node_down"):
            if node not in down and (
                resolved := self._book.resolve(job, "node_down", node, now_ns)
            ):
                out.append(resolved)
                self.back_ns[node] = now_ns
        return down

    def coming_back(self, now_ns: int) -> set[str]:
        """Nodes back from node_down for less than ``silent_after``: still rejoining."""
        grace = self._params.silent_after_ns
        for node in [n for n, at in self.back_ns.items() if now_ns - at >= grace]:
            del self.back_ns[node]
        return set(self.back_ns)

    def restore(
        self, back_ns: dict[str, int], data_ns: int, agents_ns: dict[str, int] | None = None
    ) -> None:
        """Take the rejoining nodes of a snapshot, the job's latest report in it and when
        the nodes' agents were last up."""
        self.back_ns = back_ns
        self._data_ns = data_ns
        self.agents_ns = dict(agents_ns or {})

"""The job-wide port vote: ports slow in (nearly) every connection they carry, over all
of a job's groups, and the slow connections no such port explains."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from streams.core.comm import CommTracker
from streams.core.groups import JobGroups
from streams.core.params import DetectorParams
from streams.core.places import PortHealth, Routes, conn_flow
from streams.core.slowpath import SlowPath
from streams.core.stats import median_of
from streams.core.throughput import ConnThroughputs

# Job-wide port vote: a port is slow when at least this many of its connections, and this
# share of all it carries, are slow against the job-wide baseline of their kind. A port of
# a data-parallel ring carries two (the one it sends, the one it receives): a degraded port
# slows both, a slow fabric link or a slow peer only one of them.
JOB_VOTE_MIN_CONNS = 2
JOB_VOTE_SHARE = 0.75
# This many ports of one node singled out together (no counters moving) are not port faults.
CROWDED_NODE_PORTS = 3
JOB_VOTE_EVERY_NS = 1_000_000_000


class JobVote:
    """Votes a job's slow ports at most once a second of event time, and keeps the result."""

    def __init__(
        self,
        groups: JobGroups,
        params: DetectorParams,
        ports: PortHealth,
        routes: Routes,
        throughputs: ConnThroughputs,
        *,
        fabric_known: bool,
        leaf_of: Mapping[str, str],
    ) -> None:
        self._job = groups.job
        self._groups = groups
        self._params = params
        self._ports = ports
        self._routes = routes
        self._throughputs = throughputs
        self._fabric_known = fabric_known
        self._leaf_of = leaf_of
        self._last: tuple[int, dict[str, float], list[SlowPath]] | None = None
        # This job's other connections over the fabric, each with whether it fell (slower than
        # it was on its path) or not (as fast as it was and as its kind): the evidence that
        # breaks the fabric correlator's ties.
        self.fabric_seen: list[tuple[SlowPath, bool]] = []

    def clear_seen(self) -> None:
        """Forget the job's other connections (a node of the job is down: they stall)."""
        self.fabric_seen = []

    def at(self, now_ns: int) -> tuple[dict[str, float], list[SlowPath]]:
        """Ports slow in (nearly) every connection they carry, over all the job's groups,
        and the slow connections that no such port explains (evidence for their paths).

        Each connection is held against the job-wide baseline of its kind of group (same
        size, collective or point-to-point: the same share of the fabric). A port whose
        connections are slow in most of its groups is the culprit, whether or not its
        error counters move (they raise the score); a slow fabric link slows only the
        connections that cross it, a port's neighbours have their other connections fast.
        Voted at most once a second of event time (it reads every connection).
        """
        if self._last is not None and now_ns - self._last[0] < JOB_VOTE_EVERY_NS:
            return self._last[1], self._last[2]
        samples: list[tuple[tuple[int, bool], float, CommTracker, int, int]] = []
        fell: set[tuple[str, int, int]] = set()  # connections slower than they were
        for tracker in self._groups.comms.values():
            kind = (tracker.size, ":p2p:" in tracker.comm)
            now = self._throughputs.of(tracker)
            fell.update((tracker.comm, r, p) for r, p in self._throughputs.fell(tracker, now))
            for (rank, peer), value in now.items():
                if rank < tracker.size and peer < tracker.size:
                    samples.append((kind, value, tracker, rank, peer))
        by_kind: dict[tuple[int, bool], list[float]] = {}
        for kind, value, *_ in samples:
            by_kind.setdefault(kind, []).append(value)
        typical = {kind: median_of(values) for kind, values in by_kind.items()}
        carried: Counter[str] = Counter()
        slow: Counter[str] = Counter()
        slow_conns: list[tuple[CommTracker, int, int, str, str]] = []
        others: list[tuple[CommTracker, int, int, str, str, bool]] = []
        for kind, value, tracker, rank, peer in samples:
            member_ports = self._groups.member_ports(tracker)
            src, dst = member_ports[rank], member_ports[peer]
            if src is None or dst is None:
                continue
            # Slow against its own past, and against its kind (not a share of a busy link);
            # in a ring, also fallen from at least its kind's typical speed: a connection
            # alone on its path is faster than the ring's median where ECMP doubles others
            # up, and a port that halves it may leave it no slower than those.
            fallen = (tracker.comm, rank, peer) in fell
            below = value < typical[kind] * self._params.slow_conn_share or (
                fallen
                and not kind[1]
                and self._throughputs.reference(tracker.comm, rank, peer) >= typical[kind]
            )
            is_slow = below and fallen
            if fallen or not below:
                others.append((tracker, rank, peer, src, dst, fallen))
            for port in {src, dst}:
                carried[port] += 1
                slow[port] += is_slow
            if is_slow:
                slow_conns.append((tracker, rank, peer, src, dst))
        # Each port's slow connections, gathered once: the checks below read a port's own,
        # never every slow connection of the job per port (16k of them in a slow ring).
        slow_of: dict[str, list[tuple[CommTracker, int, int, str, str]]] = {}
        for conn in slow_conns:
            for port in {conn[3], conn[4]}:
                slow_of.setdefault(port, []).append(conn)
        ports = {
            port: (0.97 if self._ports.errors_rising(port) else 0.9)
            for port, count in slow.items()
            if count >= JOB_VOTE_MIN_CONNS
            and count >= JOB_VOTE_SHARE * carried[port]
            and not _shadowed(port, slow_of[port])
            # Every one crossing one fabric link: that link explains them (the correlator's).
            and not self._shared_links(slow_of[port])
        }
        if len(ports) > max(2, len(carried) // 4):
            ports = {}  # slow nearly everywhere: no port singled out
        ports = self._without_crowded_nodes(ports)
        paths = []
        falls: dict[str, dict[tuple[int, int], float | None]] = {}
        # Slow nearly everywhere says nothing of a path, unless every slow connection crosses
        # one fabric link: a job on two leaves whose rings cross a degraded link in half
        # their hops (rail by rail, every hop leaves its node). Not once a plan has moved
        # any of them: a reroute's new load on a link slows them all the same way.
        few = len(slow_conns) <= max(4, len(samples) // 4)
        if few or (self._shared_links(slow_conns) and not self._any_moved(slow_conns)):
            for tracker, rank, peer, src, dst in slow_conns:
                if src in ports or dst in ports:
                    continue
                flow = conn_flow(self._routes, self._job, tracker.comm, rank, peer)
                via, moved = self._routes.via(flow), self._routes.moved_at(flow)
                fell_to = falls.get(tracker.comm)
                if fell_to is None:  # how far they fell, read once per group
                    fell_to = falls[tracker.comm] = self._throughputs.fallen_to(
                        tracker, [(r, p) for t, r, p, _, _ in slow_conns if t is tracker]
                    )
                paths.append(SlowPath(self._job, flow, src, dst, via, moved, fell_to[(rank, peer)]))
        self._last = (now_ns, ports, paths)
        if self._fabric_known:
            self.fabric_seen = self._seen_paths(others, ports, {path.flow for path in paths})
        return ports, paths

    def _without_crowded_nodes(self, ports: dict[str, float]) -> dict[str, float]:
        """Leave out the ports of a node where several are singled out at once, unless
        their own counters say so: NIC ports do not fail together; what they share (their
        node's uplinks, the leaf behind them, a link that went down and had its flows moved
        onto the others) does, and the fabric correlator is given their paths instead."""
        quiet = [port for port in ports if not self._ports.errors_rising(port)]
        per_node = Counter(port.rpartition("/")[0] for port in quiet)
        crowded = {node for node, count in per_node.items() if count >= CROWDED_NODE_PORTS}
        if not crowded:
            return ports
        return {
            port: score
            for port, score in ports.items()
            if port.rpartition("/")[0] not in crowded or self._ports.errors_rising(port)
        }

    def _seen_paths(
        self,
        others: list[tuple[CommTracker, int, int, str, str, bool]],
        ports: dict[str, float],
        voting: set[str],
    ) -> list[tuple[SlowPath, bool]]:
        """The connections not among the slow paths: (path, whether it fell), for the
        correlator. One that fell at a port that explains it says nothing of its links."""
        seen = []
        for tracker, rank, peer, src, dst, fallen in others:
            flow = conn_flow(self._routes, self._job, tracker.comm, rank, peer)
            if flow in voting:
                continue
            if fallen and any(
                p in ports or self._ports.errors_rising(p) or self._ports.is_down(p)
                for p in (src, dst)
            ):
                continue
            path = SlowPath(
                self._job, flow, src, dst, self._routes.via(flow), self._routes.moved_at(flow)
            )
            seen.append((path, fallen))
        return seen

    def _any_moved(self, conns: list[tuple[CommTracker, int, int, str, str]]) -> bool:
        """Whether a route plan ever moved one of these connections."""
        return any(
            self._routes.moved_at(conn_flow(self._routes, self._job, t.comm, rank, peer))
            is not None
            for t, rank, peer, _, _ in conns
        )

    def _shared_links(
        self, conns: list[tuple[CommTracker, int, int, str, str]]
    ) -> set[frozenset[str]]:
        """The fabric links (leaf, spine pairs) every one of these connections crosses; none
        when one crosses no known fabric link (inside a leaf, or its spine not known)."""
        shared: set[frozenset[str]] | None = None
        for tracker, rank, peer, src, dst in conns:
            via = self._routes.via(conn_flow(self._routes, self._job, tracker.comm, rank, peer))
            leaves = self._leaf_of.get(src), self._leaf_of.get(dst)
            if via is None or None in leaves or leaves[0] == leaves[1]:
                return set()  # a path through no known fabric link: only a port explains it
            links = {frozenset((leaf, via)) for leaf in leaves if leaf is not None}
            shared = links if shared is None else shared & links
            if not shared:
                return set()
        return shared or set()


def _shadowed(port: str, slow_conns: list[tuple[CommTracker, int, int, str, str]]) -> bool:
    """Whether another port lies on every slow connection of ``port`` (``slow_conns``: its
    own): the two ends of the same connections (a pipeline pair and nothing else) cannot be
    told apart."""
    others: set[str] | None = None
    for _, _, _, src, dst in slow_conns:
        ends = {src, dst} - {port}
        others = ends if others is None else others & ends
        if not others:
            return False
    return bool(others)

"""Slowdowns of one job: a group's operations slower than their baseline, blamed on a port
or, over a known fabric, left to the correlator as slow paths."""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import Any

from schemas.messages import Diagnosis
from streams.core.comm import CommTracker
from streams.core.findings import FindingBook, SuspectScore
from streams.core.groups import JobGroups
from streams.core.params import DetectorParams
from streams.core.places import PortHealth, Routes, conn_flow
from streams.core.slowpath import SlowPath
from streams.core.stats import median_of
from streams.core.throughput import ConnThroughputs
from streams.core.vote import JobVote


class SlowdownCheck:
    """Fires and resolves a job's ``comm_slow`` findings; keeps its slow paths."""

    def __init__(
        self,
        groups: JobGroups,
        params: DetectorParams,
        book: FindingBook,
        ports: PortHealth,
        routes: Routes,
        throughputs: ConnThroughputs,
        vote: JobVote,
        *,
        fabric_known: bool,
    ) -> None:
        self._job = groups.job
        self._groups = groups
        self._params = params
        self._book = book
        self._ports = ports
        self._routes = routes
        self._throughputs = throughputs
        self._vote = vote
        self._fabric_known = fabric_known
        self._slow_keys: dict[str, str] = {}  # comm -> open comm_slow key
        self.slow_paths: list[SlowPath] = []
        # comm -> (what it was read from, a group's slow suspects and paths): a group that
        # brought no new connection samples since, with routes, port health, places and the
        # job vote as they were, has the same answer (most checks fall between reports).
        self._suspects_of: dict[
            str, tuple[tuple[Any, ...], tuple[tuple[SuspectScore, ...], list[SlowPath]]]
        ] = {}

    def forget(self, comm: str) -> None:
        """A group's tracker was replaced: its suspects are read again."""
        self._suspects_of.pop(comm, None)

    def clear(self) -> None:
        """Every group's tracker was replaced (a restore)."""
        self._suspects_of.clear()

    def state(self) -> dict[str, str]:
        """Each slow group's open comm_slow key."""
        return self._slow_keys

    def restore(self, slow_keys: dict[str, str]) -> None:
        """Take the slow groups' keys from a snapshot."""
        self._slow_keys = slow_keys

    def stand_down(self) -> None:
        """A node of the job is down: its connections stall, no slow path, nothing to blame."""
        self.slow_paths = []
        self._vote.clear_seen()

    def check(self, now_ns: int, out: list[Diagnosis]) -> None:
        # Slow connections that no port explains are the fabric correlator's evidence
        # whether or not this job's operations slowed yet (a ring hides a slow hop behind
        # its latency on small messages): those each group singles out, and those slow
        # against the whole job (a group whose every connection is slow has no outlier).
        job_ports, job_paths = self._vote.at(now_ns)
        found: dict[str, SlowPath] = {path.flow: path for path in job_paths}
        generation, health = self._routes.generation(), self._ports.health_version()
        cacheable = generation is not None and health is not None
        votes = (generation, health, self._groups.placement_version, tuple(job_ports.items()))
        for tracker in self._groups.comms.values():
            slowdowns = tracker.slowdowns()
            stamp = (tracker.conn_version, tracker.place_version, *votes)
            cached = self._suspects_of.get(tracker.comm)
            if cacheable and cached is not None and cached[0] == stamp:
                suspects, paths = cached[1]
            else:
                suspects, paths = self._slow_suspects(tracker, job_ports)
                if cacheable:
                    self._suspects_of[tracker.comm] = (stamp, (suspects, paths))
            if not suspects and job_ports:
                mine = {p for p in self._groups.member_ports(tracker) if p in job_ports}
                if mine:
                    port = max(sorted(mine), key=lambda p: job_ports[p])
                    suspects, paths = (SuspectScore("port", port, job_ports[port]),), []
            for path in paths:
                if path.src_port not in job_ports and path.dst_port not in job_ports:
                    found.setdefault(path.flow, path)
            key = self._slow_keys.get(tracker.comm)
            if not slowdowns:
                if key is not None:
                    del self._slow_keys[tracker.comm]
                    if key not in self._slow_keys.values() and (
                        resolved := self._book.resolve(self._job, "comm_slow", key, now_ns)
                    ):
                        out.append(resolved)  # no other group is slow for the same cause
                continue
            if key is not None:
                continue
            if paths and not suspects:
                if self._fabric_known:
                    continue  # a fabric problem: the correlator names the link
                suspects = self._path_ports(paths)
            if not suspects:
                continue  # no connection evidence yet: a finding must name a culprit
            worst = max(slowdowns, key=lambda s: s.factor)
            key = suspects[0].id
            self._slow_keys[tracker.comm] = key
            evidence = {
                "comm": tracker.comm,
                "op": worst.op,
                "slowdown": round(worst.factor, 3),
                "baseline_ms": round(worst.baseline_ns / 1e6, 3),
                "recent_ms": round(worst.recent_ns / 1e6, 3),
                "throughput": self._throughput_matrix(tracker),
            }
            self._book.fire_into(
                out, self._job, "comm_slow", key, worst.since_ns, now_ns, suspects, evidence
            )
        # A port its own counters already show degraded (or down) explains its paths.
        self.slow_paths = [
            path
            for path in found.values()
            if not any(
                self._ports.errors_rising(p) or self._ports.is_down(p)
                for p in (path.src_port, path.dst_port)
            )
        ]

    def _slow_suspects(
        self, tracker: CommTracker, job_ports: dict[str, float]
    ) -> tuple[tuple[SuspectScore, ...], list[SlowPath]]:
        """A port two slow connections share, or else the slow connections' paths.

        Over a known fabric the port must be backed by more than this one group: the job's
        vote (slow in most groups it carries) or its own counters. Within one group a port
        and the path behind it look alike: a fabric link that went down moves its flows
        onto the others, and the connections of a node behind them slow, in one group on
        one port, in the next on another; the correlator, given the paths, names the link.
        """
        per_conn = self._throughputs.of(tracker)
        if not per_conn:
            return (), []
        typical = median_of(per_conn.values())
        slow = [c for c, tp in per_conn.items() if tp < typical * self._params.slow_conn_share]
        if not slow or len(slow) > max(4, len(per_conn) // 4):
            return (), []  # nothing slow, or everything: no single culprit in the matrix
        votes: Counter[str] = Counter()
        member_ports = self._groups.member_ports(tracker)
        for rank, peer in slow:
            for port in (member_ports[rank], member_ports[peer]):
                if port is not None:
                    votes[port] += 1
        if votes:
            port, count = votes.most_common(1)[0]
            rising = self._ports.errors_rising(port)
            backed = not self._fabric_known or port in job_ports or rising
            backed = backed or self._ports.is_down(port)
            if count >= 2 and (len(votes) == 1 or votes.most_common(2)[1][1] < count) and backed:
                return (SuspectScore("port", port, 0.97 if rising else 0.9),), []
        paths = []
        fell = self._throughputs.fell(tracker, per_conn)
        fell_to = self._throughputs.fallen_to(tracker, [conn for conn in slow if conn in fell])
        for rank, peer in slow:
            if (rank, peer) not in fell:
                continue  # as slow as it always was (a share of a busy link): no new fault
            src, dst = member_ports[rank], member_ports[peer]
            if src is None or dst is None:
                continue
            flow = conn_flow(self._routes, self._job, tracker.comm, rank, peer)
            paths.append(
                SlowPath(
                    self._job,
                    flow,
                    src,
                    dst,
                    self._routes.via(flow),
                    self._routes.moved_at(flow),
                    fell_to[(rank, peer)],
                )
            )
        return (), paths

    @staticmethod
    def _path_ports(paths: list[SlowPath]) -> tuple[SuspectScore, ...]:
        ports = Counter(p for path in paths for p in (path.src_port, path.dst_port))
        return tuple(SuspectScore("port", port, 0.4) for port, _ in ports.most_common(4))

    def _throughput_matrix(self, tracker: CommTracker) -> list[list[float]]:
        """Recent throughput (Gbit/s) per connection: [rank, peer, gbps] rows, for the heatmap."""
        rows: dict[tuple[int, int], list[float]] = {}
        for sample in tracker.recent_conns():
            if sample.busy_ns > 0:
                rows.setdefault((sample.rank, sample.peer), []).append(
                    8 * sample.nbytes / sample.busy_ns
                )
        return [[r, p, round(median(v), 2)] for (r, p), v in sorted(rows.items())[:256]]

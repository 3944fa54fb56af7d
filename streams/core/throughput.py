"""Connection throughput of a job's groups: on each connection's current path, now and in
its own past, and which connections fell below what they were."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streams.core.comm import CommTracker, ConnSample
from streams.core.params import DetectorParams
from streams.core.places import Routes
from streams.core.slowpath import fall_ratio
from streams.core.stats import median_of

# A slow connection is slow against its own past too: this quantile of its kept samples.
HISTORY_QUANTILE = 0.8


class ConnThroughputs:
    """Each connection's throughput (bytes/ns) per group, cached while its samples hold."""

    def __init__(self, job: str, params: DetectorParams, routes: Routes) -> None:
        self._job = job
        self._params = params
        self._routes = routes
        # (comm, history) -> ((samples' version, routes' generation), throughput per
        # connection): read several times a check by the group and job votes, and valid
        # until the group's next connection report or the next move of a flow.
        self._throughputs: dict[
            tuple[str, bool], tuple[tuple[int, int | None], dict[tuple[int, int], float]]
        ] = {}
        self._rank_throughputs: dict[
            tuple[str, bool],
            dict[int, tuple[tuple[int, int | None], dict[tuple[int, int], float]]],
        ] = {}
        # comm/rank->peer -> (reference throughput, the move it was measured after)
        self._conn_ref: dict[str, tuple[float, int]] = {}
        # comm -> rank -> (the stamps of its throughputs now and in its own past, which of
        # its connections fell): `fell` again on the same throughputs gives the same answer
        # and leaves the references as they are, so a check reads only the ranks that
        # reported since the last one.
        self._fell: dict[str, _Fell] = {}

    def new_check(self) -> None:
        """A check begins: with moves learnt unannounced, what was computed is stale."""
        if self._routes.generation() is None:
            self._throughputs.clear()  # moves learnt unannounced: valid for this check only

    def forget(self, comm: str) -> None:
        """A group's tracker was replaced: what was computed from the old one is gone."""
        for history in (False, True):  # counted by the tracker this one replaces
            self._throughputs.pop((comm, history), None)
            self._rank_throughputs.pop((comm, history), None)
        self._fell.pop(comm, None)

    def clear(self) -> None:
        """Every group's tracker was replaced (a restore)."""
        self._throughputs.clear()  # computed from trackers that are gone
        self._rank_throughputs.clear()
        self._fell.clear()

    def state(self) -> dict[str, tuple[float, int]]:
        """Each connection's reference throughput and the move it was measured after."""
        return self._conn_ref

    def restore(self, refs: dict[str, Any]) -> None:
        """Take the connections' references from a snapshot."""
        self._conn_ref = {str(k): (float(ref), int(moved)) for k, (ref, moved) in refs.items()}
        self._fell.clear()

    def reference(self, comm: str, rank: int, peer: int) -> float:
        """A connection's own past throughput as `fell` last held it against (0: none)."""
        known = self._conn_ref.get(f"{comm}/{rank}->{peer}")
        return 0.0 if known is None else known[0]

    def fallen_to(
        self, tracker: CommTracker, conns: Iterable[tuple[int, int]]
    ) -> dict[tuple[int, int], float | None]:
        """How far each of these connections fell on its path: the median of its recent
        samples below the slow share of its reference (those since it fell), over that
        reference; None without a reference or such samples.

        Not the median of all its recent samples: just after a fall those straddle it (half
        from before: a link that went dark would read as fallen to half).
        """
        share = self._params.slow_conn_share
        wanted = set(conns)
        values: dict[tuple[int, int], list[float]] = {}
        for rank in {rank for rank, _ in wanted}:
            for sample in tracker.recent_of(rank):
                conn = (sample.rank, sample.peer)
                if conn not in wanted or sample.busy_ns <= 0:
                    continue
                moved = self._routes.moved_at(f"{self._job}/{tracker.comm}/{conn[0]}->{conn[1]}")
                if moved is None or sample.ts_ns >= moved:  # this path's samples only
                    values.setdefault(conn, []).append(sample.nbytes / sample.busy_ns)
        found: dict[tuple[int, int], float | None] = {}
        for conn in wanted:
            reference = self.reference(tracker.comm, *conn)
            low = [v for v in values.get(conn, ()) if v < share * reference]
            found[conn] = fall_ratio(median_of(low), reference) if low else None
        return found

    def fell(self, tracker: CommTracker, now: dict[tuple[int, int], float]) -> set[tuple[int, int]]:
        """Connections of a group slower than they were on their current path.

        A connection slow for good (two flows ECMP put on one link) is slow against the
        others, not against itself. Its reference is a high quantile of its kept samples,
        frozen while it is slow against it, so a fault that lasts stays visible after the
        samples from before it are gone.
        """
        history = self.of(tracker, history=True)
        generation = self._routes.generation()
        current = self._throughputs.get((tracker.comm, False))
        if generation is None or current is None or current[1] is not now:
            self._fell.pop(tracker.comm, None)  # references move outside what it holds
            return self._fell_among(tracker, now, history)
        now_of = self._rank_throughputs[(tracker.comm, False)]
        past_of = self._rank_throughputs.get((tracker.comm, True), {})
        known = self._fell.get(tracker.comm)
        changed: Iterable[int] | None = None
        if known is None or known.generation != generation:
            known = self._fell[tracker.comm] = _Fell(generation)
        elif known.now is now:
            changed = tracker.conn_ranks_since(known.version)
        if changed is None:
            # Every rank, in the order of the connections (references are first stored in
            # that order); those whose throughputs did not move are skipped all the same.
            changed = tracker.conns
        known.version, known.now = tracker.conn_version, now
        for rank in changed:
            values = now_of.get(rank)
            if values is None:
                continue
            past = past_of.get(rank)
            stamp = (values[0], None if past is None else past[0])
            before = known.by_rank.get(rank)
            if before is not None and before[0] == stamp:
                continue
            found = self._fell_among(tracker, values[1], history)
            if before is not None:
                known.fell -= before[1]
            known.fell |= found
            known.by_rank[rank] = (stamp, found)
        return set(known.fell)

    def _fell_among(
        self,
        tracker: CommTracker,
        now: dict[tuple[int, int], float],
        history: dict[tuple[int, int], float],
    ) -> set[tuple[int, int]]:
        """Of these connections, those slower than their reference (which this updates)."""
        share = self._params.slow_conn_share
        fell = set()
        for conn, value in now.items():
            key = f"{tracker.comm}/{conn[0]}->{conn[1]}"
            moved = self._routes.moved_at(f"{self._job}/{key}") or 0
            known = self._conn_ref.get(key)
            ref = history.get(conn, value)
            if known is not None and known[1] == moved and value < share * known[0]:
                ref = known[0]  # still slow: the reference from before it fell holds
            self._conn_ref[key] = (ref, moved)
            if value < share * ref:
                fell.add(conn)
        return fell

    def of(self, tracker: CommTracker, *, history: bool = False) -> dict[tuple[int, int], float]:
        """Each connection's throughput on its current path, from its recent samples (its
        median) or from every sample kept (a high quantile: its own past).

        A connection is its sending rank's (rank, peer), measured in that rank's reports
        only: what was computed from one rank's samples holds until that rank reports
        again or a flow moves, and is kept per rank (a group's ranks report at their own
        moments, so one of them is nearly always new).
        """
        key = (tracker.comm, history)
        generation = self._routes.generation()
        version = (tracker.conn_version, generation)
        known = self._throughputs.get(key)
        if known is not None and known[0] == version:
            return known[1]
        per_rank = self._rank_throughputs.setdefault(key, {})
        if known is not None and generation is not None and known[0][1] == generation:
            changed = tracker.conn_ranks_since(known[0][0])
            if changed is not None and self._update(
                tracker, history, generation, per_rank, changed, known[1]
            ):
                self._throughputs[key] = (version, known[1])
                return known[1]
        found: dict[tuple[int, int], float] = {}
        for rank in tracker.conns:
            stamp = (tracker.conn_reports.get(rank, 0), generation)
            cached = per_rank.get(rank)
            if cached is None or cached[0] != stamp or generation is None:
                cached = per_rank[rank] = (stamp, self._rank_values(tracker, rank, history))
            found.update(cached[1])
        self._throughputs[key] = (version, found)
        return found

    def _update(
        self,
        tracker: CommTracker,
        history: bool,
        generation: int,
        per_rank: dict[int, tuple[tuple[int, int | None], dict[tuple[int, int], float]]],
        changed: set[int],
        found: dict[tuple[int, int], float],
    ) -> bool:
        """Take the ranks that reported since ``found`` was read into it, in place; False
        (``found`` to be read again in full) when one of them has other connections than
        before, or the same in another order: the connections keep the order a full read
        gives them (which connection a vote names first on a tie)."""
        fresh = []
        for rank in changed:
            stamp = (tracker.conn_reports.get(rank, 0), generation)
            cached = per_rank.get(rank)
            if cached is not None and cached[0] == stamp:
                continue
            values = self._rank_values(tracker, rank, history)
            if cached is None or list(cached[1]) != list(values):  # other keys, or order
                per_rank[rank] = (stamp, values)
                return False
            fresh.append((rank, stamp, values))
        for rank, stamp, values in fresh:
            per_rank[rank] = (stamp, values)
            found.update(values)
        return True

    def _rank_values(
        self, tracker: CommTracker, rank: int, history: bool
    ) -> dict[tuple[int, int], float]:
        """One rank's connections' throughput now, or in its own past."""
        if history:
            return self._own_past(tracker, rank)
        return self._conn_throughput(tracker, tracker.recent_of(rank))

    def _own_past(self, tracker: CommTracker, rank: int) -> dict[tuple[int, int], float]:
        """The high quantile of each of a rank's connections over its kept samples, read
        off the tracker's sorted values; a flow that moved counts only its samples since."""
        found: dict[tuple[int, int], float] = {}
        moved = False
        for peer, values in tracker.conn_sorted.get(rank, {}).items():
            if self._routes.moved_at(f"{self._job}/{tracker.comm}/{rank}->{peer}") is not None:
                moved = True
            elif values:
                found[(rank, peer)] = values[
                    min(len(values) - 1, int(HISTORY_QUANTILE * len(values)))
                ]
        if moved:
            kept = list(tracker.conns.get(rank, ()))
            return self._conn_throughput(tracker, kept, HISTORY_QUANTILE)
        return found

    def _conn_throughput(
        self, tracker: CommTracker, samples: list[ConnSample] | None = None, q: float = 0.5
    ) -> dict[tuple[int, int], float]:
        """Throughput of each connection of a group on its current path: the ``q``
        quantile of its recent samples (or of ``samples``)."""
        throughput: dict[tuple[int, int], list[float]] = {}
        moved: dict[tuple[int, int], int | None] = {}
        for sample in tracker.recent_conns() if samples is None else samples:
            conn = (sample.rank, sample.peer)
            if conn not in moved:
                flow = f"{self._job}/{tracker.comm}/{sample.rank}->{sample.peer}"
                moved[conn] = self._routes.moved_at(flow)
            since = moved[conn]
            if since is not None and sample.ts_ns < since:
                continue  # measured on the path it had before a reroute: not this path's
            if sample.busy_ns > 0:
                throughput.setdefault(conn, []).append(sample.nbytes / sample.busy_ns)
        if q == 0.5:
            return {conn: median_of(values) for conn, values in throughput.items()}
        return {
            conn: sorted(values)[min(len(values) - 1, int(q * len(values)))]
            for conn, values in throughput.items()
        }


class _Fell:
    """Which connections of one group fell, per rank, as of a report count and a routes'
    generation."""

    __slots__ = ("by_rank", "fell", "generation", "now", "version")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.version = 0
        # The throughputs read last time: another dict means they were read again in full.
        self.now: dict[tuple[int, int], float] | None = None
        self.by_rank: dict[int, tuple[tuple[Any, Any], set[tuple[int, int]]]] = {}
        self.fell: set[tuple[int, int]] = set()

"""All detectors of one job: its communicators, nodes and open findings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

from schemas.messages import Collective, Diagnosis, Job, RankPlace
from streams.core.comm import NOT_YET, CommTracker, ConnSample, Hang, Member
from streams.core.compute import ComputeTracker
from streams.core.findings import FindingBook, SuspectScore
from streams.core.params import DetectorParams
from streams.core.places import PortHealth, Routes, gpu_id, port_id, rank_id
from streams.core.stats import median_of

HANG_KEY = "hang"
MULTI_SUSPECT_PATIENCE_NS = 1_000_000_000
# Job-wide port vote: a port is slow when at least this many of its connections, and this
# share of all it carries, are slow against the job-wide baseline of their kind.
JOB_VOTE_MIN_CONNS = 3
JOB_VOTE_SHARE = 0.75
# This many ports of one node singled out together (no counters moving) are not port faults.
CROWDED_NODE_PORTS = 3
JOB_VOTE_EVERY_NS = 1_000_000_000
# A slow connection is slow against its own past too: this quantile of its kept samples.
HISTORY_QUANTILE = 0.8


@dataclass(frozen=True, slots=True)
class SlowPath:
    """A slow connection no port explains: evidence for the fabric correlator."""

    job: str
    flow: str
    src_port: str
    dst_port: str
    via: str | None
    moved_ns: int | None = None  # when a plan last moved the flow to ``via`` (event time)


class JobDetector:
    """Turns one job's collective reports into findings."""

    def __init__(
        self,
        job: str,
        params: DetectorParams,
        ports: PortHealth,
        routes: Routes,
        *,
        fabric_known: bool = False,
        leaf_of: Mapping[str, str] | None = None,
    ) -> None:
        self.job = job
        # With a topology the fabric correlator names links from slow paths; without one,
        # this job names the two ports of its slow connections itself.
        self._fabric_known = fabric_known
        self._leaf_of = leaf_of or {}
        self.params = params
        self._ports = ports
        self._routes = routes
        self.comms: dict[str, CommTracker] = {}
        self.placement: dict[int, RankPlace] = {}
        self.book = FindingBook()
        self.compute = ComputeTracker(params.straggler_slice_ns)
        self._vote: tuple[int, dict[str, float], list[SlowPath]] | None = None
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
        self._anchors_of = -1  # how many communicators the anchor groups were chosen from
        self._slow_keys: dict[str, str] = {}  # comm -> open comm_slow key
        self.slow_paths: list[SlowPath] = []
        # This job's other connections over the fabric, each with whether it fell (slower than
        # it was on its path) or not (as fast as it was and as its kind): the evidence that
        # breaks the fabric correlator's ties.
        self.fabric_seen: list[tuple[SlowPath, bool]] = []
        # Next check in this job's own data time, when its reports lag the clock.
        self.next_check_ns = 0
        # Nodes whose node_down just resolved -> when: their ranks report again one by one,
        # and those not yet back must not read as a new hang meanwhile.
        self._back_ns: dict[str, int] = {}
        # The job's latest report time. After a gap in which none of its nodes reported
        # (the data path stopped: agents or broker away, records skipped, a restore from a
        # snapshot older than the offsets the worker goes on from), the first report is no
        # sign that the other nodes are gone: until each reports again they count as seen
        # at that report (``_seen_floor``), and one silent for ``silent_after`` past it is.
        self._data_ns = -1
        self._seen_floor: tuple[int, frozenset[str]] | None = None
        # comm -> (what it was read from, a group's slow suspects and paths): a group that
        # brought no new connection samples since, with routes, port health, places and the
        # job vote as they were, has the same answer (most checks fall between reports).
        self._suspects_of: dict[
            str, tuple[tuple[Any, ...], tuple[tuple[SuspectScore, ...], list[SlowPath]]]
        ] = {}
        self._placement_version = 0
        self._ports_by_comm: dict[str, tuple[tuple[int, int], CommTracker, list[str | None]]] = {}

    # --- input -----------------------------------------------------------------------
    def on_collective(self, message: Collective) -> None:
        """Take one rank's report."""
        ts_ns = message.ts_ns
        if ts_ns > self._data_ns:
            if self._data_ns >= 0 and ts_ns - self._data_ns > self.params.silent_after_ns:
                self._resume_after_gap(ts_ns)
            self._data_ns = ts_ns
        tracker = self.comms.get(message.comm)
        if tracker is None or tracker.size != message.comm_size:
            tracker = CommTracker(self.job, message.comm, message.comm_size, self.params)
            self.comms[message.comm] = tracker
            for history in (False, True):  # counted by the tracker this one replaces
                self._throughputs.pop((message.comm, history), None)
                self._rank_throughputs.pop((message.comm, history), None)
            self._suspects_of.pop(message.comm, None)
        tracker.ingest(message)
        ops = message.ops
        self.compute.add(
            message.global_rank,
            message.comm,
            message.ts_ns,
            ops.seq,
            ops.op,
            ops.bytes,
            ops.enter_ns,
            ops.end_ns,
        )

    def on_job(self, message: Job) -> None:
        """Learn the job's placement."""
        self.placement = {place.rank: place for place in message.ranks}
        self._placement_version += 1

    # --- places ----------------------------------------------------------------------
    def _place(self, member: Member) -> tuple[str | None, int | None, str | None]:
        node, gpu, port = member.node, member.gpu, member.port
        if member.global_rank is not None:
            place = self.placement.get(member.global_rank)
            if place is not None:
                node = node or place.node
                gpu = gpu if gpu is not None else place.gpu
                port = port or place.port
        return node, gpu, port

    def _rank_suspect(self, member: Member, score: float) -> SuspectScore:
        node, gpu, _ = self._place(member)
        if node is not None and gpu is not None:
            return SuspectScore("gpu", gpu_id(node, gpu), score)
        return SuspectScore("rank", rank_id(self.job, member.global_rank or 0), score)

    def _member_ports(self, tracker: CommTracker) -> list[str | None]:
        """The NIC port (global id) of each member of a group, kept while its places hold."""
        stamp = (tracker.place_version, self._placement_version)
        known = self._ports_by_comm.get(tracker.comm)
        if known is not None and known[0] == stamp and known[1] is tracker:
            return known[2]
        ports = [self._port_of(member) for member in tracker.members]
        self._ports_by_comm[tracker.comm] = (stamp, tracker, ports)
        return ports

    def _port_of(self, member: Member) -> str | None:
        node, _, port = self._place(member)
        return port_id(node, port) if node is not None and port is not None else None

    # --- checks ----------------------------------------------------------------------
    def check(self, now_ns: int) -> list[Diagnosis]:
        """Evaluate every condition at event time ``now_ns``; emit what changed.

        Judged no later than ``silent_after`` past this job's latest report: the clock may
        run ahead of a job's reports (live, other partitions' messages or a backlog being
        caught up; a broker outage, when only the timer moves it), and a conclusion needs
        the job's own reports to show it. A real hang leaves the live ranks' heartbeats.
        """
        out: list[Diagnosis] = []
        if self._routes.generation() is None:
            self._throughputs.clear()  # moves learnt unannounced: valid for this check only
        data_now = max(
            (m.last_seen_ns for tracker in self.comms.values() for m in tracker.members),
            default=-1,
        )
        if data_now >= 0:
            now_ns = min(now_ns, data_now + self.params.silent_after_ns)
        down = self._check_nodes(now_ns, out)
        hung = self._check_hangs(now_ns, down | self._coming_back(now_ns), out)
        self._check_stragglers(now_ns, hung or bool(down), out)
        if down:
            # Connections to a node that is gone stall: no slow path, no slowdown to blame.
            self.slow_paths = []
            self.fabric_seen = []
        else:
            self._check_slowdowns(now_ns, out)
        return out

    def _node_last_seen(self) -> dict[str, int]:
        seen: dict[str, int] = {}
        for tracker in self.comms.values():
            for member in tracker.members:
                node, _, _ = self._place(member)
                if node is not None and member.last_seen_ns >= 0:
                    seen[node] = max(seen.get(node, -1), member.last_seen_ns)
        if self._seen_floor is not None:
            floor, nodes = self._seen_floor
            for node in nodes & seen.keys():
                seen[node] = max(seen[node], floor)
        return seen

    def _resume_after_gap(self, ts_ns: int) -> None:
        """The first report after the whole job was silent: a gap is no node's silence."""
        down = set(self.book.open_keys(self.job, "node_down"))
        nodes = frozenset(node for node in self._node_last_seen() if node not in down)
        self._seen_floor = (ts_ns, nodes)

    def _check_nodes(self, now_ns: int, out: list[Diagnosis]) -> set[str]:
        seen = self._node_last_seen()
        cutoff = now_ns - self.params.silent_after_ns
        alive = [node for node, ts in seen.items() if ts >= cutoff]
        # Gone means silent while the others went on reporting for as long: when every
        # node stops together (the job ended, the data stopped) none of them is down.
        latest = max(seen.values(), default=-1)
        down = {
            node
            for node, ts in seen.items()
            if ts < cutoff and ts < latest - self.params.silent_after_ns
        }
        for node in sorted(down):
            fired = self.book.fire(
                self.job,
                "node_down",
                node,
                seen[node],
                now_ns,
                (SuspectScore("node", node, 0.95),),
                {"last_seen_ns": seen[node], "nodes_alive": len(alive)},
            )
            if fired:
                out.append(fired)
        for node in self.book.open_keys(self.job, "node_down"):
            if node not in down and (
                resolved := self.book.resolve(self.job, "node_down", node, now_ns)
            ):
                out.append(resolved)
                self._back_ns[node] = now_ns
        return down

    def _coming_back(self, now_ns: int) -> set[str]:
        """Nodes back from node_down for less than ``silent_after``: still rejoining."""
        grace = self.params.silent_after_ns
        for node in [n for n, at in self._back_ns.items() if now_ns - at >= grace]:
            del self._back_ns[node]
        return set(self._back_ns)

    def _waiting_ranks(self) -> set[int]:
        """Global ranks inside an operation they entered and have not finished."""
        waiting: set[int] = set()
        for tracker in self.comms.values():
            for state in tracker.pending.values():
                if state.entered == state.ended:
                    continue
                for r, (enter, end) in enumerate(zip(state.enter, state.end, strict=True)):
                    if enter != NOT_YET and end == NOT_YET:
                        rank = tracker.members[r].global_rank
                        if rank is not None:
                            waiting.add(rank)
        return waiting

    def _check_hangs(self, now_ns: int, down: set[str], out: list[Diagnosis]) -> bool:
        """Hangs of the job, attributed across its communicators; whether one is due.

        A rank missing from one group's operation while it waits inside another's is a
        waiter, not a culprit: who waits for whom is followed over every communicator
        (point-to-point pairs too) to the ranks that wait on nothing, and those are named.
        When every missing rank is a waiter, the root is an operation every member entered
        and none can finish (comm_hang).
        """
        noncomm: list[tuple[CommTracker, Hang, list[Member]]] = []
        comm: list[tuple[CommTracker, Hang]] = []
        due = False
        for tracker in self.comms.values():
            # Half-due hangs count too: a rank stuck before a small intra-node operation shows
            # as 1 missing there and as its whole group missing in the big one, whose report
            # may have come first.
            hang = tracker.hang(now_ns, share=0.5)
            if hang is None:
                continue
            due = due or tracker.hang(now_ns) is not None
            if hang.kind == "noncomm":
                missing = [tracker.members[r] for r in hang.missing]
                unexplained = [m for m in missing if self._place(m)[0] not in down]
                if unexplained:
                    noncomm.append((tracker, hang, unexplained))
            elif not down:
                # With a node of the job down, every rank ends up blocked behind it (an op
                # issued after the stuck one cannot finish either): node_down explains it.
                comm.append((tracker, hang))
        open_cls = [
            c for c in ("noncomm_hang", "comm_hang") if self.book.is_open(self.job, c, HANG_KEY)
        ]
        if not due:
            noncomm, comm = [], []
        culprits: dict[int, tuple[CommTracker, Hang, Member]] = {}
        unattributed: list[tuple[CommTracker, Hang, list[Member]]] = []
        if noncomm:
            waiting = self._waiting_ranks()
            for tracker, hang, members in noncomm:
                free = [m for m in members if m.global_rank not in waiting]
                if any(m.global_rank is None for m in free):
                    unattributed.append((tracker, hang, free))
                for member in free:
                    if member.global_rank is None:
                        continue
                    known = culprits.get(member.global_rank)
                    # The smallest group that misses it is the most specific evidence.
                    if known is None or tracker.size < known[0].size:
                        culprits[member.global_rank] = (tracker, hang, member)
        if culprits or unattributed:
            if culprits:
                named = sorted(
                    culprits.values(), key=lambda item: (item[0].size, item[2].global_rank or 0)
                )
                tracker, hang, _ = named[0]
                members = [item[2] for item in named]
            else:
                tracker, hang, members = min(unattributed, key=lambda item: len(item[2]))
            if len(members) > 2 and not self.book.is_open(self.job, "noncomm_hang", HANG_KEY):
                # Many missing at once is often one rank seen from a big communicator while
                # the small one that names it has not reported yet: give it a second.
                # Counted in the job's own data time, so that a live clock running ahead of
                # lagging data waits for it (up to ten seconds of engine time).
                due_at = hang.since_ns + self.params.hang_after_ns(tracker.median_op_ns())
                data_now = max(self._node_last_seen().values(), default=now_ns)
                patience = MULTI_SUSPECT_PATIENCE_NS
                if data_now < due_at + patience and now_ns < due_at + 10 * patience:
                    return True
            score = 0.95 if len(members) <= 2 else max(0.3, 0.95 * 2 / len(members))
            suspects = tuple(self._rank_suspect(m, score) for m in members[:16])
            evidence: dict[str, Any] = {
                "comm": tracker.comm,
                "seq": hang.seq,
                "missing_ranks": list(hang.missing[:64]),
                "waiting_ranks": len(hang.unfinished),
            }
            self._fire(out, "noncomm_hang", HANG_KEY, hang.since_ns, now_ns, suspects, evidence)
        elif comm:
            tracker, hang = min(comm, key=lambda item: item[1].since_ns)
            suspects = self._stalled_suspects(tracker, hang)
            evidence = {
                "comm": tracker.comm,
                "seq": hang.seq,
                "unfinished_ranks": list(hang.unfinished[:64]),
            }
            self._fire(out, "comm_hang", HANG_KEY, hang.since_ns, now_ns, suspects, evidence)
        elif not noncomm:
            for cls in open_cls:
                if resolved := self.book.resolve(self.job, cls, HANG_KEY, now_ns):
                    out.append(resolved)
        return due or bool(open_cls)

    def _stalled_suspects(self, tracker: CommTracker, hang: Hang) -> tuple[SuspectScore, ...]:
        ports = self._member_ports(tracker)
        dead = sorted({p for p in ports if p is not None and self._ports.is_down(p)})
        if dead:
            return tuple(SuspectScore("port", p, 0.95) for p in dead[:4])
        # Which connection stopped moving bytes: the ranks whose latest samples carry none.
        idle = Counter(ports[s.rank] for s in tracker.recent_conns(intervals=1) if s.nbytes == 0)
        idle.pop(None, None)
        if idle:
            return tuple(SuspectScore("port", str(p), 0.6) for p, _ in idle.most_common(2))
        return ()

    def _fire(
        self,
        out: list[Diagnosis],
        cls: Any,
        key: str,
        onset: int,
        now: int,
        suspects: tuple[SuspectScore, ...],
        evidence: dict[str, Any],
    ) -> None:
        fired = self.book.fire(self.job, cls, key, onset, now, suspects, evidence)
        if fired is not None:
            out.append(fired)

    def _anchor_groups(self) -> None:
        """Give each rank's largest collective group sync points (its compute windows); a
        point-to-point pair joins two pipeline stages, whose work differs: never an anchor."""
        if self._anchors_of == len(self.comms):
            return
        largest: dict[int, CommTracker] = {}
        complete = True
        for tracker in self.comms.values():
            if ":p2p:" in tracker.comm or tracker.size < 2:
                continue
            for member in tracker.members:
                rank = member.global_rank
                if rank is None:
                    complete = False
                    continue
                best = largest.get(rank)
                if best is None or (tracker.size, tracker.comm) > (best.size, best.comm):
                    largest[rank] = tracker
        anchors = {id(t) for t in largest.values()}
        for tracker in self.comms.values():
            tracker.sync_every_ns = self.params.straggler_slice_ns if id(tracker) in anchors else 0
        if complete:
            self._anchors_of = len(self.comms)

    def _drain_syncs(self) -> None:
        for tracker in self.comms.values():
            if not tracker.syncs:
                continue
            ranks = [m.global_rank for m in tracker.members]
            members = tuple(r for r in ranks if r is not None)
            if len(members) == tracker.size:
                for _, ends in tracker.syncs:
                    self.compute.sync(tracker.comm, members, ends)
            tracker.syncs.clear()

    def _member_of(self, global_rank: int) -> tuple[CommTracker, int] | None:
        """The collective group (the largest) and communicator rank of a global rank."""
        best: tuple[CommTracker, int] | None = None
        for tracker in self.comms.values():
            if ":p2p:" in tracker.comm:
                continue
            for index, member in enumerate(tracker.members):
                if member.global_rank == global_rank and (
                    best is None or tracker.size > best[0].size
                ):
                    best = (tracker, index)
        return best

    def _check_stragglers(self, now_ns: int, hung: bool, out: list[Diagnosis]) -> None:
        params = self.params
        compute = self.compute
        self._anchor_groups()
        self._drain_syncs()
        compute.judge()
        naming: dict[str, tuple[SuspectScore, dict[str, Any], int]] = {}
        open_keys = set(self.book.open_keys(self.job, "noncomm_slow"))
        for threshold, keep in (
            (params.straggler_compute_factor, False),
            (params.straggler_resolve_factor, True),
        ):
            for slow in compute.slow_ranks(
                params.straggler_slices, params.straggler_min_slices, threshold
            ):
                found = self._member_of(slow.global_rank)
                if found is None:
                    continue
                tracker, index = found
                score = min(0.99, 0.5 + (slow.ratio - 1) * 2.5)
                suspect = self._rank_suspect(tracker.members[index], score)
                if keep != (suspect.id in open_keys) or suspect.id in naming:
                    continue  # new ones at the firing factor, open ones down to the resolve one
                if hung and suspect.id not in open_keys:
                    continue  # a rank that stopped computes "long": the hang names it
                lags = [lag for r, lag, _ in tracker.last_entrants if r == index]
                evidence = {
                    "comm": tracker.comm,
                    "rank": index,
                    "median_lag_ms": round((median(lags) if lags else slow.excess_ns) / 1e6, 3),
                    "compute_ratio": round(slow.ratio, 3),
                    "slices": slow.slices,
                }
                naming[suspect.id] = (suspect, evidence, slow.since_ns)
        for key, (suspect, evidence, since) in naming.items():
            self._fire(out, "noncomm_slow", key, since, now_ns, (suspect,), evidence)
        for key in open_keys:
            if key not in naming and (
                resolved := self.book.resolve(self.job, "noncomm_slow", key, now_ns)
            ):
                out.append(resolved)

    def _check_slowdowns(self, now_ns: int, out: list[Diagnosis]) -> None:
        # Slow connections that no port explains are the fabric correlator's evidence
        # whether or not this job's operations slowed yet (a ring hides a slow hop behind
        # its latency on small messages): those each group singles out, and those slow
        # against the whole job (a group whose every connection is slow has no outlier).
        job_ports, job_paths = self._job_vote(now_ns)
        found: dict[str, SlowPath] = {path.flow: path for path in job_paths}
        generation, health = self._routes.generation(), self._ports.health_version()
        cacheable = generation is not None and health is not None
        votes = (generation, health, self._placement_version, tuple(job_ports.items()))
        for tracker in self.comms.values():
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
                mine = {p for p in self._member_ports(tracker) if p in job_ports}
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
                        resolved := self.book.resolve(self.job, "comm_slow", key, now_ns)
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
            self._fire(out, "comm_slow", key, worst.since_ns, now_ns, suspects, evidence)
        # A port its own counters already show degraded (or down) explains its paths.
        self.slow_paths = [
            path
            for path in found.values()
            if not any(
                self._ports.errors_rising(p) or self._ports.is_down(p)
                for p in (path.src_port, path.dst_port)
            )
        ]

    def _fell(
        self, tracker: CommTracker, now: dict[tuple[int, int], float]
    ) -> set[tuple[int, int]]:
        """Connections of a group slower than they were on their current path.

        A connection slow for good (two flows ECMP put on one link) is slow against the
        others, not against itself. Its reference is a high quantile of its kept samples,
        frozen while it is slow against it, so a fault that lasts stays visible after the
        samples from before it are gone.
        """
        history = self._throughput_of(tracker, history=True)
        share = self.params.slow_conn_share
        fell = set()
        for conn, value in now.items():
            key = f"{tracker.comm}/{conn[0]}->{conn[1]}"
            moved = self._routes.moved_at(f"{self.job}/{key}") or 0
            known = self._conn_ref.get(key)
            ref = history.get(conn, value)
            if known is not None and known[1] == moved and value < share * known[0]:
                ref = known[0]  # still slow: the reference from before it fell holds
            self._conn_ref[key] = (ref, moved)
            if value < share * ref:
                fell.add(conn)
        return fell

    def _throughput_of(
        self, tracker: CommTracker, *, history: bool = False
    ) -> dict[tuple[int, int], float]:
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
        found: dict[tuple[int, int], float] = {}
        for rank in tracker.conns:
            stamp = (tracker.conn_reports.get(rank, 0), generation)
            cached = per_rank.get(rank)
            if cached is None or cached[0] != stamp or generation is None:
                if history:
                    values = self._own_past(tracker, rank)
                else:
                    values = self._conn_throughput(tracker, tracker.recent_of(rank))
                cached = per_rank[rank] = (stamp, values)
            found.update(cached[1])
        self._throughputs[key] = (version, found)
        return found

    def _own_past(self, tracker: CommTracker, rank: int) -> dict[tuple[int, int], float]:
        """The high quantile of each of a rank's connections over its kept samples, read
        off the tracker's sorted values; a flow that moved counts only its samples since."""
        found: dict[tuple[int, int], float] = {}
        moved = False
        for peer, values in tracker.conn_sorted.get(rank, {}).items():
            if self._routes.moved_at(f"{self.job}/{tracker.comm}/{rank}->{peer}") is not None:
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
                flow = f"{self.job}/{tracker.comm}/{sample.rank}->{sample.peer}"
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

    def _job_vote(self, now_ns: int) -> tuple[dict[str, float], list[SlowPath]]:
        """Ports slow in (nearly) every connection they carry, over all the job's groups,
        and the slow connections that no such port explains (evidence for their paths).

        Each connection is held against the job-wide baseline of its kind of group (same
        size, collective or point-to-point: the same share of the fabric). A port whose
        connections are slow in most of its groups is the culprit, whether or not its
        error counters move (they raise the score); a slow fabric link slows only the
        connections that cross it, a port's neighbours have their other connections fast.
        Voted at most once a second of event time (it reads every connection).
        """
        if self._vote is not None and now_ns - self._vote[0] < JOB_VOTE_EVERY_NS:
            return self._vote[1], self._vote[2]
        samples: list[tuple[tuple[int, bool], float, CommTracker, int, int]] = []
        fell: set[tuple[str, int, int]] = set()  # connections slower than they were
        for tracker in self.comms.values():
            kind = (tracker.size, ":p2p:" in tracker.comm)
            now = self._throughput_of(tracker)
            fell.update((tracker.comm, r, p) for r, p in self._fell(tracker, now))
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
            member_ports = self._member_ports(tracker)
            src, dst = member_ports[rank], member_ports[peer]
            if src is None or dst is None:
                continue
            # Slow against its kind and against its own past (not a share of a busy link).
            fallen = (tracker.comm, rank, peer) in fell
            below = value < typical[kind] * self.params.slow_conn_share
            is_slow = below and fallen
            if fallen or not below:
                others.append((tracker, rank, peer, src, dst, fallen))
            for port in {src, dst}:
                carried[port] += 1
                slow[port] += is_slow
            if is_slow:
                slow_conns.append((tracker, rank, peer, src, dst))
        ports = {
            port: (0.97 if self._ports.errors_rising(port) else 0.9)
            for port, count in slow.items()
            if count >= JOB_VOTE_MIN_CONNS
            and count >= JOB_VOTE_SHARE * carried[port]
            and not _shadowed(port, slow_conns)
            and not self._behind_one_link(port, slow_conns)
        }
        if len(ports) > max(2, len(carried) // 4):
            ports = {}  # slow nearly everywhere: no port singled out
        ports = self._without_crowded_nodes(ports)
        paths = []
        if len(slow_conns) <= max(4, len(samples) // 4):
            for tracker, rank, peer, src, dst in slow_conns:
                if src in ports or dst in ports:
                    continue
                flow = f"{self.job}/{tracker.comm}/{rank}->{peer}"
                via, moved = self._routes.via(flow), self._routes.moved_at(flow)
                paths.append(SlowPath(self.job, flow, src, dst, via, moved))
        self._vote = (now_ns, ports, paths)
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
            flow = f"{self.job}/{tracker.comm}/{rank}->{peer}"
            if flow in voting:
                continue
            if fallen and any(
                p in ports or self._ports.errors_rising(p) or self._ports.is_down(p)
                for p in (src, dst)
            ):
                continue
            path = SlowPath(
                self.job, flow, src, dst, self._routes.via(flow), self._routes.moved_at(flow)
            )
            seen.append((path, fallen))
        return seen

    def _behind_one_link(
        self, port: str, slow_conns: list[tuple[CommTracker, int, int, str, str]]
    ) -> bool:
        """Whether every slow connection of ``port`` crosses one fabric link (leaf~spine,
        from the plan's spines): that link explains them, the correlator's business."""
        shared: set[frozenset[str]] | None = None
        for tracker, rank, peer, src, dst in slow_conns:
            if port not in (src, dst):
                continue
            via = self._routes.via(f"{self.job}/{tracker.comm}/{rank}->{peer}")
            leaves = self._leaf_of.get(src), self._leaf_of.get(dst)
            if via is None or None in leaves or leaves[0] == leaves[1]:
                return False  # a path through no known fabric link: only the port explains it
            links = {frozenset((leaf, via)) for leaf in leaves if leaf is not None}
            shared = links if shared is None else shared & links
            if not shared:
                return False
        return bool(shared)

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
        per_conn = self._throughput_of(tracker)
        if not per_conn:
            return (), []
        typical = median_of(per_conn.values())
        slow = [c for c, tp in per_conn.items() if tp < typical * self.params.slow_conn_share]
        if not slow or len(slow) > max(4, len(per_conn) // 4):
            return (), []  # nothing slow, or everything: no single culprit in the matrix
        votes: Counter[str] = Counter()
        member_ports = self._member_ports(tracker)
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
        fell = self._fell(tracker, per_conn)
        for rank, peer in slow:
            if (rank, peer) not in fell:
                continue  # as slow as it always was (a share of a busy link): no new fault
            src, dst = member_ports[rank], member_ports[peer]
            if src is None or dst is None:
                continue
            flow = f"{self.job}/{tracker.comm}/{rank}->{peer}"
            paths.append(
                SlowPath(
                    self.job, flow, src, dst, self._routes.via(flow), self._routes.moved_at(flow)
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

    # --- snapshot ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """This job's detector state as plain data (placement, communicators, findings)."""
        return {
            "placement": [place.model_dump(mode="json") for place in self.placement.values()],
            "comms": {comm: tracker.state() for comm, tracker in self.comms.items()},
            "findings": self.book.state(),
            "compute": self.compute.state(),
            "conn_ref": self._conn_ref,
            "slow_keys": self._slow_keys,
            "back": self._back_ns,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take the state of a snapshot (this detector was just created for the job)."""
        places = (RankPlace.model_validate(place) for place in state["placement"])
        self.placement = {place.rank: place for place in places}
        self.comms = {
            comm: CommTracker.restored(self.job, comm, self.params, tracker)
            for comm, tracker in state["comms"].items()
        }
        self._throughputs.clear()  # computed from trackers that are gone
        self._rank_throughputs.clear()
        self._suspects_of.clear()
        self._placement_version += 1
        self.book.restore(state["findings"])
        if "compute" in state:
            self.compute = ComputeTracker.restored(state["compute"])
        refs = state.get("conn_ref", {})
        self._conn_ref = {str(k): (float(ref), int(moved)) for k, (ref, moved) in refs.items()}
        self._slow_keys = state["slow_keys"]
        self._back_ns = {str(node): int(at) for node, at in state.get("back", {}).items()}
        self._data_ns = max(
            (m.last_seen_ns for tracker in self.comms.values() for m in tracker.members),
            default=-1,
        )

    def close(self, now_ns: int) -> list[Diagnosis]:
        """Resolve every open finding (the job stopped)."""
        return self.book.resolve_all(now_ns)


def _shadowed(port: str, slow_conns: list[tuple[CommTracker, int, int, str, str]]) -> bool:
    """Whether another port lies on every slow connection of ``port``: the two ends of the
    same connections (a pipeline pair and nothing else) cannot be told apart."""
    others: set[str] | None = None
    for _, _, _, src, dst in slow_conns:
        if port not in (src, dst):
            continue
        ends = {src, dst} - {port}
        others = ends if others is None else others & ends
        if not others:
            return False
    return bool(others)

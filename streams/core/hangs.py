"""Hangs of one job: an operation some ranks never finish, attributed across its groups."""

from __future__ import annotations

from collections import Counter
from typing import Any

from schemas.messages import Diagnosis
from streams.core.comm import NOT_YET, CommTracker, Hang, Member
from streams.core.findings import FindingBook, SuspectScore
from streams.core.groups import JobGroups
from streams.core.nodes import NodeWatch
from streams.core.params import DetectorParams
from streams.core.places import PortHealth

HANG_KEY = "hang"
MULTI_SUSPECT_PATIENCE_NS = 1_000_000_000


class HangCheck:
    """Fires and resolves a job's ``noncomm_hang`` and ``comm_hang`` findings."""

    def __init__(
        self,
        groups: JobGroups,
        params: DetectorParams,
        book: FindingBook,
        ports: PortHealth,
        nodes: NodeWatch,
    ) -> None:
        self._job = groups.job
        self._groups = groups
        self._params = params
        self._book = book
        self._ports = ports
        self._nodes = nodes

    def _waiting_ranks(self, now_ns: int) -> set[int]:
        """Global ranks inside an operation they entered and have not finished, and still
        reporting: one silent since, while the job's others report, is stopped, not waiting."""
        waiting: set[int] = set()
        cutoff = self._silent_before(now_ns)
        for tracker in self._groups.comms.values():
            for state in tracker.pending.values():
                if state.entered == state.ended:
                    continue
                for r, (enter, end) in enumerate(zip(state.enter, state.end, strict=True)):
                    if enter != NOT_YET and end == NOT_YET:
                        member = tracker.members[r]
                        if member.last_seen_ns < cutoff:
                            continue
                        if member.global_rank is not None:
                            waiting.add(member.global_rank)
        return waiting

    def check(self, now_ns: int, down: set[str], out: list[Diagnosis]) -> bool:
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
        for tracker in self._groups.comms.values():
            # Half-due hangs count too: a rank stuck before a small intra-node operation shows
            # as 1 missing there and as its whole group missing in the big one, whose report
            # may have come first.
            hang = tracker.hang(now_ns, share=0.5)
            if hang is None:
                continue
            due = due or tracker.hang(now_ns) is not None
            if hang.kind == "noncomm":
                missing = [tracker.members[r] for r in hang.missing]
                unexplained = [m for m in missing if self._groups.place(m)[0] not in down]
                if unexplained:
                    noncomm.append((tracker, hang, unexplained))
            elif not down:
                # With a node of the job down, every rank ends up blocked behind it (an op
                # issued after the stuck one cannot finish either): node_down explains it.
                comm.append((tracker, hang))
        open_cls = [
            c for c in ("noncomm_hang", "comm_hang") if self._book.is_open(self._job, c, HANG_KEY)
        ]
        if not due:
            noncomm, comm = [], []
        culprits: dict[int, tuple[CommTracker, Hang, Member]] = {}
        unattributed: list[tuple[CommTracker, Hang, list[Member]]] = []
        if noncomm:
            waiting = self._waiting_ranks(now_ns)
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
            if len(members) > 2 and not self._book.is_open(self._job, "noncomm_hang", HANG_KEY):
                # Many missing at once is often one rank seen from a big communicator while
                # the small one that names it has not reported yet: give it a second.
                # Counted in the job's own data time, so that a live clock running ahead of
                # lagging data waits for it (up to ten seconds of engine time).
                due_at = hang.since_ns + self._params.hang_after_ns(tracker.median_op_ns())
                data_now = max(self._nodes.last_seen().values(), default=now_ns)
                patience = MULTI_SUSPECT_PATIENCE_NS
                if data_now < due_at + patience and now_ns < due_at + 10 * patience:
                    return True
            score = 0.95 if len(members) <= 2 else max(0.3, 0.95 * 2 / len(members))
            reported = _known(members)
            suspects = tuple(self._groups.rank_suspect(m, score) for m in reported[:16])
            evidence: dict[str, Any] = {
                "comm": tracker.comm,
                "seq": hang.seq,
                "missing_ranks": list(hang.missing[:64]),  # ranks inside the communicator
                "suspect_global_ranks": [m.global_rank for m in reported[:16]],
                "waiting_ranks": len(hang.unfinished),
            }
            self._book.fire_into(
                out, self._job, "noncomm_hang", HANG_KEY, hang.since_ns, now_ns, suspects, evidence
            )
        elif comm and (silent := self._silent_inside(comm, now_ns)):
            # Inside the operation and silent since, while the others report (their heartbeats
            # go on) on nodes that are up: those processes stopped (SIGSTOP, a crash), not
            # the network. Their node is up, or node_down would explain it.
            tracker, hang, members = silent
            reported = _known(members)
            suspects = tuple(self._groups.rank_suspect(m, 0.95) for m in reported[:16])
            evidence = {
                "comm": tracker.comm,
                "seq": hang.seq,
                "silent_ranks": [m.global_rank for m in members[:64]],
                "suspect_global_ranks": [m.global_rank for m in reported[:16]],
                "waiting_ranks": len(hang.unfinished) - len(members),
            }
            self._book.fire_into(
                out, self._job, "noncomm_hang", HANG_KEY, hang.since_ns, now_ns, suspects, evidence
            )
        elif comm:
            tracker, hang = min(comm, key=lambda item: item[1].since_ns)
            suspects = self._stalled_suspects(tracker, hang)
            evidence = {
                "comm": tracker.comm,
                "seq": hang.seq,
                "unfinished_ranks": list(hang.unfinished[:64]),
            }
            self._book.fire_into(
                out, self._job, "comm_hang", HANG_KEY, hang.since_ns, now_ns, suspects, evidence
            )
        elif not noncomm:
            for cls in open_cls:
                if resolved := self._book.resolve(self._job, cls, HANG_KEY, now_ns):
                    out.append(resolved)
        return due or bool(open_cls)

    def _silent_before(self, now_ns: int) -> int:
        """Reports older than this are a silent rank's: ``silent_after`` before both now and
        the job's latest report. A job whose reports lag behind the clock (a backlog caught
        up, the rest of an interval not read yet) has no silent rank for that; a job silent
        as a whole has none either."""
        latest = max(self._nodes.last_seen().values(), default=-1)
        return min(now_ns, latest) - self._params.silent_after_ns

    def _silent_inside(
        self, comm: list[tuple[CommTracker, Hang]], now_ns: int
    ) -> tuple[CommTracker, Hang, list[Member]] | None:
        """The stalled operation whose unfinished members went silent while the job's others
        still report: the earliest such, with those members."""
        cutoff = self._silent_before(now_ns)
        for tracker, hang in sorted(comm, key=lambda item: item[1].since_ns):
            inside = [tracker.members[r] for r in hang.unfinished]
            silent = [m for m in inside if m.last_seen_ns < cutoff]
            if silent:
                return tracker, hang, sorted(silent, key=lambda m: m.global_rank or 0)
        return None

    def _stalled_suspects(self, tracker: CommTracker, hang: Hang) -> tuple[SuspectScore, ...]:
        ports = self._groups.member_ports(tracker)
        dead = sorted({p for p in ports if p is not None and self._ports.is_down(p)})
        if dead:
            return tuple(SuspectScore("port", p, 0.95) for p in dead[:4])
        # Which connection stopped moving bytes: the ranks whose latest samples carry none.
        idle = Counter(ports[s.rank] for s in tracker.recent_conns(intervals=1) if s.nbytes == 0)
        idle.pop(None, None)
        if idle:
            return tuple(SuspectScore("port", str(p), 0.6) for p, _ in idle.most_common(2))
        return ()


def _known(members: list[Member]) -> list[Member]:
    """The members whose global rank is known: only they can be named (a member that never
    reported is known by its index in the communicator, which names another rank)."""
    return [m for m in members if m.global_rank is not None]

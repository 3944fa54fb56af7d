"""Stragglers of one job: a rank that computes longer between its groups' sync points."""

from __future__ import annotations

from statistics import median
from typing import Any

from schemas.messages import Collective, Diagnosis
from streams.core.comm import CommTracker
from streams.core.compute import ComputeTracker
from streams.core.findings import FindingBook, SuspectScore
from streams.core.groups import JobGroups
from streams.core.params import DetectorParams


class StragglerCheck:
    """Fires and resolves a job's ``noncomm_slow`` findings from its ranks' compute time."""

    def __init__(self, groups: JobGroups, params: DetectorParams, book: FindingBook) -> None:
        self._job = groups.job
        self._groups = groups
        self._params = params
        self._book = book
        self.compute = ComputeTracker(params.straggler_slice_ns)
        self._anchors_of = -1  # how many communicators the anchor groups were chosen from
        # global rank -> (its largest collective group, its rank there), and what it was
        # built from (each group with its places' version)
        self._members_index: dict[int, tuple[CommTracker, int]] = {}
        self._members_stamp: tuple[tuple[int, int], ...] | None = None

    def add(self, message: Collective) -> None:
        """Take one rank's report of its latest operation."""
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

    def _anchor_groups(self) -> None:
        """Give each rank's largest collective group sync points (its compute windows); a
        point-to-point pair joins two pipeline stages, whose work differs: never an anchor."""
        if self._anchors_of == len(self._groups.comms):
            return
        largest: dict[int, CommTracker] = {}
        complete = True
        for tracker in self._groups.comms.values():
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
        for tracker in self._groups.comms.values():
            tracker.sync_every_ns = self._params.straggler_slice_ns if id(tracker) in anchors else 0
        if complete:
            self._anchors_of = len(self._groups.comms)

    def _drain_syncs(self) -> None:
        for tracker in self._groups.comms.values():
            if not tracker.syncs:
                continue
            ranks = [m.global_rank for m in tracker.members]
            members = tuple(r for r in ranks if r is not None)
            if len(members) == tracker.size:
                for _, ends in tracker.syncs:
                    self.compute.sync(tracker.comm, members, ends)
            tracker.syncs.clear()

    def _members(self) -> dict[int, tuple[CommTracker, int]]:
        """Each global rank's collective group (the largest; of equal ones the larger id, as
        `_anchor_groups` picks the group its windows are judged in, whatever order the
        groups were first seen in) and its rank there."""
        stamp = tuple(
            (id(tracker), tracker.place_version) for tracker in self._groups.comms.values()
        )
        if stamp != self._members_stamp:
            # One pass over every member of every group, again only when a group or a
            # member's rank changed: a lookup per slow rank, not a scan of the job.
            index: dict[int, tuple[CommTracker, int]] = {}
            for tracker in self._groups.comms.values():
                if ":p2p:" in tracker.comm:
                    continue
                for position, member in enumerate(tracker.members):
                    rank = member.global_rank
                    if rank is None:
                        continue
                    best = index.get(rank)
                    if best is None or (tracker.size, tracker.comm) > (
                        best[0].size,
                        best[0].comm,
                    ):
                        index[rank] = (tracker, position)
            self._members_index = index
            self._members_stamp = stamp
        return self._members_index

    def check(self, now_ns: int, hung: bool, out: list[Diagnosis]) -> None:
        params = self._params
        compute = self.compute
        self._anchor_groups()
        self._drain_syncs()
        compute.judge()
        naming: dict[str, tuple[SuspectScore, dict[str, Any], int]] = {}
        open_keys = set(self._book.open_keys(self._job, "noncomm_slow"))
        for threshold, keep in (
            (params.straggler_compute_factor, False),
            (params.straggler_resolve_factor, True),
        ):
            slow_ranks = compute.slow_ranks(
                params.straggler_slices, params.straggler_min_slices, threshold
            )
            members = self._members() if slow_ranks else {}
            for slow in slow_ranks:
                found = members.get(slow.global_rank)
                if found is None:
                    continue
                tracker, index = found
                score = min(0.99, 0.5 + (slow.ratio - 1) * 2.5)
                suspect = self._groups.rank_suspect(tracker.members[index], score)
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
            self._book.fire_into(
                out, self._job, "noncomm_slow", key, since, now_ns, (suspect,), evidence
            )
        for key in open_keys:
            if key not in naming and (
                resolved := self._book.resolve(self._job, "noncomm_slow", key, now_ns)
            ):
                out.append(resolved)

    def restore(self, compute: dict[str, Any]) -> None:
        """Take the ranks' compute windows from a snapshot."""
        self.compute = ComputeTracker.restored(compute)

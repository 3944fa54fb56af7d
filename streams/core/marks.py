"""Compute marks: each rank's compute time summed up to the end of each of its group's
operations, where its operation spans are (the node stage), differenced between sync points
where the windows are (the job stage).

A rank's compute time in a window (`streams.core.compute`) is the window minus the union
of its operations of every group. That union is additive over adjacent windows, and so are
the all-to-all bytes and the operations that completed in them. So the node stage, which
holds the ranks' spans, times each rank between consecutive ends of each of its groups'
operations once the rank reported past the later one (what the job stage's check would
wait for), and keeps running sums. At each barrier it hands on, per group and operation,
the sums of the members it took (`MarkBlock`). The job stage times a window from one sync
point to the next as the difference of the two operations' sums: per sync point and
member, not per operation and rank.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from streams.core.comm import Report
from streams.core.compute import PRUNE_AT, ComputeTracker, SliceTime


@dataclass(frozen=True, slots=True)
class MarkBlock:
    """Some members' compute sums at their ends of one operation of a group."""

    comm: str
    seq: int
    members: tuple[int, ...]  # communicator ranks
    compute: tuple[int, ...]  # ns computing, summed since the member's first mark
    a2a: tuple[int, ...]  # all-to-all bytes that completed, summed alike
    completed: tuple[int, ...]  # operations that completed, summed alike


@dataclass(slots=True)
class _Chain:
    """One member's ends of one group's operations, timed in order once reported past."""

    global_rank: int
    queued: deque[tuple[int, int]] = field(default_factory=deque)  # (seq, its end)
    last_seq: int = -1
    last_end: int | None = None
    compute: int = 0
    a2a: int = 0
    completed: int = 0


class RankMarks:
    """The node stage's side: its ranks' operation spans and their marks."""

    def __init__(self) -> None:
        self.spans = ComputeTracker(0)  # the ranks' operations only; no windows here
        self._chains: dict[tuple[str, int], _Chain] = {}
        # Per global rank, its largest group so far ((size, comm), its rank there): only
        # that group's windows judge it (`StragglerCheck._anchor_groups` picks the same).
        self._largest: dict[int, tuple[tuple[int, str], int]] = {}

    def add(self, report: Report) -> None:
        """Take one report: its operations as spans, its ended ones as marks to come."""
        ops = report.ops
        self.spans.add(
            report.global_rank,
            report.comm,
            report.ts_ns,
            ops.seq,
            ops.op,
            ops.bytes,
            ops.enter_ns,
            ops.end_ns,
        )
        if report.comm_size < 2 or ":p2p:" in report.comm:
            return  # never a window's group (`StragglerCheck._anchor_groups`)
        group = (report.comm_size, report.comm)
        largest = self._largest.get(report.global_rank)
        if largest is not None and largest[0] != group:
            if largest[0] > group:
                return  # not the group its windows are of
            self._chains.pop((largest[0][1], largest[1]), None)
        self._largest[report.global_rank] = (group, report.rank)
        key = (report.comm, report.rank)
        chain = self._chains.get(key)
        if chain is None or chain.global_rank != report.global_rank:
            chain = self._chains[key] = _Chain(report.global_rank)
        for seq, end in zip(ops.seq, ops.end_ns, strict=True):
            if end is not None and seq > chain.last_seq:
                chain.queued.append((seq, end))
                chain.last_seq = seq

    def forget(self, comm: str) -> None:
        """A group was replaced (its size changed): its marks start again."""
        for key in [key for key in self._chains if key[0] == comm]:
            del self._chains[key]
        for rank in [r for r, (group, _) in self._largest.items() if group[1] == comm]:
            del self._largest[rank]

    def marks(self) -> list[MarkBlock]:
        """The marks every member's reports have passed since the last call."""
        ranks = self.spans.ranks
        blocks: dict[tuple[str, int], tuple[list[int], list[int], list[int], list[int]]] = {}
        keep_from: dict[int, int] = {}
        for (comm, member), chain in self._chains.items():
            rank = ranks.get(chain.global_rank)
            if rank is None or not rank.reported:
                continue
            queued = chain.queued
            if queued:
                reported = min(rank.reported.values())
                while queued and queued[0][1] <= reported:
                    seq, end = queued.popleft()
                    if chain.last_end is not None and end > chain.last_end:
                        slice_time: SliceTime = self.spans.span(rank, chain.last_end, end)
                        chain.compute += slice_time.compute_ns
                        chain.a2a += slice_time.a2a_bytes
                        chain.completed += slice_time.completed
                    if chain.last_end is None or end > chain.last_end:
                        chain.last_end = end
                    block = blocks.get((comm, seq))
                    if block is None:
                        block = blocks[(comm, seq)] = ([], [], [], [])
                    block[0].append(member)
                    block[1].append(chain.compute)
                    block[2].append(chain.a2a)
                    block[3].append(chain.completed)
            if chain.last_end is not None:
                since = keep_from.get(chain.global_rank)
                if since is None or chain.last_end < since:
                    keep_from[chain.global_rank] = chain.last_end
        self._prune(keep_from)
        return [
            MarkBlock(comm, seq, tuple(m), tuple(c), tuple(a), tuple(n))
            for (comm, seq), (m, c, a, n) in blocks.items()
        ]

    def _prune(self, keep_from: dict[int, int]) -> None:
        """Drop the operations every chain of their rank has timed past."""
        for global_rank, since in keep_from.items():
            rank = self.spans.ranks[global_rank]
            if len(rank.ops) >= PRUNE_AT:
                rank.ops = [(a, b) for a, b in rank.ops if b > since]
            if len(rank.a2a) >= PRUNE_AT:
                rank.a2a = [(b, n) for b, n in rank.a2a if b > since]


class MarkBook:
    """The job stage's side: the marks handed on, per group and operation, until no
    window can need them."""

    def __init__(self) -> None:
        self._blocks: dict[str, dict[int, list[MarkBlock]]] = {}
        self._index: dict[tuple[str, int], tuple[int, dict[int, tuple[int, int, int]]]] = {}

    def add(self, block: MarkBlock) -> None:
        """Take one node stage's marks of one operation."""
        self._blocks.setdefault(block.comm, {}).setdefault(block.seq, []).append(block)

    def of(self, comm: str, seq: int) -> dict[int, tuple[int, int, int]]:
        """Each member's sums at its end of one operation, of the marks that came."""
        blocks = self._blocks.get(comm, {}).get(seq, [])
        known = self._index.get((comm, seq))
        if known is not None and known[0] == len(blocks):
            return known[1]
        sums: dict[int, tuple[int, int, int]] = {}
        for block in blocks:
            for member, c, a, n in zip(
                block.members, block.compute, block.a2a, block.completed, strict=True
            ):
                sums.setdefault(member, (c, a, n))
        self._index[(comm, seq)] = (len(blocks), sums)
        return sums

    def forget_before(self, comm: str, seq: int) -> None:
        """No window of the group starts before ``seq`` any more."""
        seqs = self._blocks.get(comm)
        if not seqs:
            return
        for old in [each for each in seqs if each < seq]:
            del seqs[old]
            self._index.pop((comm, old), None)

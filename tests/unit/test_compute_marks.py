"""Compute marks: a window timed as the difference of its two sync points' sums is the
window timed from the ranks' spans (`streams.core.marks`)."""

from __future__ import annotations

import random

from schemas.messages import Collective, Ops
from streams.core.compute import ComputeTracker
from streams.core.marks import MarkBook, RankMarks

MS = 1_000_000


def _report(
    rank: int,
    comm: str,
    size: int,
    ts: int,
    ops: list[tuple[int, int, int | None]],
    global_rank: int | None = None,
) -> Collective:
    return Collective(
        v=1,
        kind="collective",
        job="j",
        comm=comm,
        comm_size=size,
        rank=rank,
        global_rank=rank if global_rank is None else global_rank,
        ts_ns=ts,
        ops=Ops(
            seq=tuple(seq for seq, _, _ in ops),
            op=tuple("allreduce" if size > 2 else "send" for _ in ops),
            bytes=tuple(1 << 20 for _ in ops),
            enter_ns=tuple(enter for _, enter, _ in ops),
            end_ns=tuple(end for _, _, end in ops),
        ),
    )


def _job(seed: int) -> list[Collective]:
    """Four ranks in one group and two pairs of a smaller one, each rank computing a random
    while between operations, some of them overlapping across groups."""
    rng = random.Random(seed)
    reports = []
    for rank in range(4):
        clock = 0
        for seq in range(40):
            clock += rng.randint(2, 9) * MS  # computing
            enter = clock
            clock += rng.randint(1, 4) * MS
            reports.append(_report(rank, "big", 4, clock + MS, [(seq, enter, clock)]))
            if seq % 3 == 0:  # the smaller group's operation, overlapping the next compute
                small = f"small-{rank // 2}"
                start = clock - rng.randint(0, 2) * MS
                op = [(seq, start, clock + 2 * MS)]
                reports.append(_report(rank % 2, small, 2, clock + 3 * MS, op, rank))
    reports.sort(key=lambda r: r.ts_ns)
    return reports


def test_a_window_timed_by_marks_is_the_window_timed_by_spans() -> None:
    for seed in range(5):
        reports = _job(seed)
        whole = ComputeTracker(100 * MS)
        marks = RankMarks()
        book = MarkBook()
        for report in reports:
            ops = report.ops
            whole.add(
                report.global_rank,
                report.comm,
                report.ts_ns,
                ops.seq,
                ops.op,
                ops.bytes,
                ops.enter_ns,
                ops.end_ns,
            )
            marks.add(report)
        for block in marks.marks():
            book.add(block)
        ends = {
            (r.comm, r.rank, seq): end
            for r in reports
            for seq, end in zip(r.ops.seq, r.ops.end_ns, strict=True)
            if end is not None
        }
        for first, last in ((3, 10), (10, 17), (17, 30)):
            before, after = book.of("big", first), book.of("big", last)
            for member in range(4):
                rank = whole.ranks[member]
                lo, hi = ends[("big", member, first)], ends[("big", member, last)]
                expected = whole.span(rank, lo, hi)
                got = tuple(b - a for a, b in zip(before[member], after[member], strict=True))
                assert got == (expected.compute_ns, expected.a2a_bytes, expected.completed)


def test_marks_wait_until_the_rank_reported_past_them() -> None:
    marks = RankMarks()
    marks.add(_report(0, "big", 4, 10 * MS, [(0, 1 * MS, 2 * MS), (1, 5 * MS, 6 * MS)]))
    marks.add(_report(0, "pair", 2, 3 * MS, [(0, 2 * MS, 3 * MS)]))
    # Its pair's report covers it to 3 ms only: seq 1 of the big group (6 ms) waits.
    blocks = marks.marks()
    assert [(b.comm, b.seq) for b in blocks] == [("big", 0)]
    marks.add(_report(0, "pair", 2, 9 * MS, [(1, 7 * MS, 8 * MS)]))
    (later,) = marks.marks()
    # From its end of seq 0 (2 ms) to that of seq 1 (6 ms): busy 2-3 ms (the pair) and
    # 5-6 ms, computing 2 ms; two operations completed in it.
    assert (later.seq, later.compute, later.completed) == (1, (2 * MS,), (2,))

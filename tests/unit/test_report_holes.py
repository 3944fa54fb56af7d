"""A report that runs on from its member's last one skips the scan for lost reports, and
the trackers end where a scan at every report would have left them
(`streams.core.comm.reports_through`)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from schemas.messages import Collective, Collectives
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import FAULT_TYPES
from streams.core.comm import NO_SEQ, CommTracker, Reach, reports_through
from streams.core.params import DetectorParams
from streams.core.shard import ShardComm
from tests.unit.suite_cases import suite_case

# (rank, ts_ns, seqs, ops, bytes, enters, ends): what `ShardComm.ingest` takes.
Report = tuple[
    int,
    int,
    tuple[int, ...],
    tuple[str, ...],
    tuple[int, ...],
    tuple[int, ...],
    tuple[int | None, ...],
]


def test_a_report_running_on_from_the_last_leaves_no_hole() -> None:
    # Entered through 4, ended through 3: the next report starts at the op in flight.
    assert reports_through((4, 5, 6), (40, 50, None), 4, 3) == (6, 5)
    assert reports_through((5, 6), (50, 60), 4, 4) == (6, 6)
    # Nothing new: no hole, and what it reaches itself (the caller keeps the furthest).
    assert reports_through((4,), (None,), 4, 3) == (4, -1)


@pytest.mark.parametrize(
    ("seqs", "ends", "entered_to", "ended_to"),
    [
        ((6, 7), (60, 70), 4, 4),  # seq 5 was never reported: a lost report
        ((5, 7), (50, 70), 4, 4),  # a gap inside the report
        ((5, 6, 7), (None, 60, 70), 4, 4),  # 5 ends after 6 did: filled in as ended
        ((5, 6), (50, 60), NO_SEQ, NO_SEQ),  # nothing known of the member yet
        ((4, 5, 6), (40, 50, 60), 4, 2),  # 3 entered but never said to end
    ],
)
def test_a_report_that_may_leave_a_hole_is_scanned(
    seqs: tuple[int, ...], ends: tuple[int | None, ...], entered_to: int, ended_to: int
) -> None:
    assert reports_through(seqs, ends, entered_to, ended_to) is None


def _reports_of(kind: str) -> dict[str, list[Collective]]:
    scenario = suite_case(kind)
    comms: dict[str, list[Collective]] = {}
    for message in simulate_cluster(build_cluster(None, scenario), scenario):
        batch = message.messages if isinstance(message, Collectives) else [message]
        for each in batch:
            if isinstance(each, Collective):
                comms.setdefault(each.comm, []).append(each)
    return comms


def _roughened(reports: list[Collective], seed: int) -> list[Report]:
    """The reports as a lossy, repeating transport delivers them: some lost, some twice,
    some late."""
    rng = random.Random(seed)
    out: list[Report] = []
    for r in reports:
        row: Report = (
            r.rank,
            r.ts_ns,
            r.ops.seq,
            r.ops.op,
            r.ops.bytes,
            r.ops.enter_ns,
            r.ops.end_ns,
        )
        draw = rng.random()
        if draw < 0.05:
            continue  # lost
        out.append(row)
        if draw > 0.95:
            out.append(row)  # again
    for _ in range(len(out) // 50):  # a few late ones
        i = rng.randrange(len(out) - 1)
        j = min(len(out) - 1, i + rng.randrange(1, 20))
        out[i], out[j] = out[j], out[i]
    return out


def _collective(first: Collective, row: Report) -> Collective:
    rank, ts_ns, seqs, names, sizes, enters, ends = row
    ops = first.ops.model_copy(
        update={"seq": seqs, "op": names, "bytes": sizes, "enter_ns": enters, "end_ns": ends}
    )
    return first.model_copy(update={"rank": rank, "ts_ns": ts_ns, "ops": ops, "conns": None})


def _tracker_state(tracker: CommTracker) -> dict[str, Any]:
    state = tracker.state()
    return {**state, "ops_seen": tracker.ops_seen, "finished": tracker.finished_ns}


@pytest.mark.parametrize("kind", FAULT_TYPES)
def test_a_tracker_ends_where_a_scan_at_every_report_leaves_it(kind: str) -> None:
    params = DetectorParams()
    for n, reports in enumerate(_reports_of(kind).values()):
        first = reports[0]
        quick = CommTracker(first.job, first.comm, first.comm_size, params)
        scanned = CommTracker(first.job, first.comm, first.comm_size, params)
        skipped = 0
        for row in _roughened(reports, seed=n):
            message = _collective(first, row)
            for member in scanned.members:  # nothing known: the scan every time
                member.reach = Reach()
            reach = quick.members[row[0]].reach
            skipped += reports_through(row[2], row[6], reach.entered_to, reach.ended_to) is not None
            quick.ingest(message)
            scanned.ingest(message)
        assert _tracker_state(quick) == _tracker_state(scanned), (kind, first.comm)
        assert skipped  # the quick way was taken at all


@pytest.mark.parametrize("kind", FAULT_TYPES)
def test_a_shard_hands_on_what_a_scan_at_every_report_hands_on(kind: str) -> None:
    for n, reports in enumerate(_reports_of(kind).values()):
        first = reports[0]
        quick = ShardComm(first.comm, first.comm_size)
        scanned = ShardComm(first.comm, first.comm_size)
        handed: list[list[Any]] = [[], []]
        for row in _roughened(reports, seed=100 + n):
            scanned.through.clear()  # nothing known: the scan every time
            for index, shard in enumerate((quick, scanned)):
                shard.ingest(*row)
                handed[index].extend(shard.drain())
        assert handed[0] == handed[1], (kind, first.comm)
        assert quick.open_parts() == scanned.open_parts()
        assert quick.finished_ns == scanned.finished_ns

"""A communicator's members spread over shards complete the same operations, and learn the
same from them, as one tracker taking every member's reports (`streams.core.shard`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
import pytest

from schemas.base import C4Model
from schemas.messages import Collective, Collectives
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import FAULT_TYPES, scenario_from
from streams.core.comm import MAX_COMPLETED, CommTracker
from streams.core.params import DetectorParams
from streams.core.shard import SeqMerge, ShardComm
from tests.unit.suite_cases import suite_case

SYNC_EVERY_NS = 500_000_000


def _collectives(messages: Iterable[C4Model]) -> list[Collective]:
    out: list[Collective] = []
    for message in messages:
        if isinstance(message, Collectives):
            out.extend(message.messages)
        elif isinstance(message, Collective):
            out.append(message)
    return out


def _learnt(tracker: CommTracker) -> dict[str, Any]:
    """What a tracker learnt from its completed operations."""
    state = tracker.state()
    return {
        "ops_seen": tracker.ops_seen,
        "floor": state["floor"],
        "spans": state["spans"],
        "periods": state["periods"],
        "last_entrants": state["last_entrants"],
        "baselines": state["baselines"],
        "slow_since": state["slow_since"],
        "fresh": state["fresh"],
        "last_end_ns": tracker.last_end_ns,
        "syncs": [(seq, list(ends)) for seq, ends in tracker.syncs],
    }


def _compare(reports: list[Collective], shards: int) -> tuple[CommTracker, CommTracker]:
    """One tracker fed every report; one fed the parts of ``shards`` shards by node."""
    params = DetectorParams()
    first = reports[0]
    whole = CommTracker(first.job, first.comm, first.comm_size, params)
    merged = CommTracker(first.job, first.comm, first.comm_size, params)
    whole.sync_every_ns = merged.sync_every_ns = SYNC_EVERY_NS
    merge = SeqMerge(merged)
    nodes = sorted({r.node or "" for r in reports})
    shard_of = {node: i % shards for i, node in enumerate(nodes)}
    parts = [ShardComm(first.comm, first.comm_size) for _ in range(shards)]
    for report in reports:
        whole.ingest(report)
        shard = parts[shard_of[report.node or ""]]
        ops = report.ops
        shard.ingest(
            report.rank, report.ts_ns, ops.seq, ops.op, ops.bytes, ops.enter_ns, ops.end_ns
        )
        for part in shard.drain():
            merge.add(part)
    return whole, merged


def _by_comm(messages: Iterable[C4Model]) -> dict[str, list[Collective]]:
    comms: dict[str, list[Collective]] = {}
    for report in _collectives(messages):
        comms.setdefault(report.comm, []).append(report)
    return comms


def _data_parallel(ranks: int) -> list[C4Model]:
    scenario = scenario_from(
        {
            "name": "shards-dp",
            "seed": 3,
            "duration_s": 6.0,
            "jobs": [{"id": "job-dp", "ranks": ranks, "comms": ["dp", "tp"], "compute_ms": 50.0}],
            "faults": [
                {"type": "slow_gpu", "job": "job-dp", "rank": 5, "at_s": 2.0, "factor": 1.3}
            ],
        }
    )
    return list(simulate_cluster(build_cluster(None, scenario), scenario))


@pytest.mark.parametrize("shards", [1, 2, 4, 7])
def test_a_data_parallel_group_over_shards_learns_what_one_tracker_learns(shards: int) -> None:
    comms = _by_comm(_data_parallel(64))
    largest = max(comms.values(), key=lambda reports: reports[0].comm_size)
    assert largest[0].comm_size == 64
    for reports in comms.values():
        whole, merged = _compare(reports, shards)
        assert whole.ops_seen > 10
        assert _learnt(merged) == _learnt(whole)


@pytest.mark.parametrize("kind", FAULT_TYPES)
def test_every_group_of_a_faulty_job_over_shards_learns_what_one_tracker_learns(
    kind: str,
) -> None:
    scenario = suite_case(kind)
    messages = list(simulate_cluster(build_cluster(None, scenario), scenario))
    for reports in _by_comm(messages).values():
        for shards in (2, 3):
            whole, merged = _compare(reports, shards)
            assert _learnt(merged) == _learnt(whole), (kind, reports[0].comm, shards)


def test_a_report_again_of_a_handed_on_operation_is_not_counted_twice() -> None:
    shard = ShardComm("c", 2)
    shard.ingest(0, 10, (1,), ("allreduce",), (8,), (1,), (5,))  # known alone: its own part
    shard.ingest(1, 10, (1,), ("allreduce",), (8,), (2,), (6,))  # joined since: its own
    shard.ingest(1, 11, (1,), ("allreduce",), (8,), (2,), (6,))  # the same report again
    shard.ingest(0, 20, (2,), ("allreduce",), (8,), (11,), (15,))
    shard.ingest(1, 20, (2,), ("allreduce",), (8,), (12,), (16,))
    shard.ingest(0, 21, (2,), ("allreduce",), (8,), (11,), (15,))  # again
    parts = shard.drain()
    assert [(p.seq, p.members) for p in parts] == [(1, (0,)), (1, (1,)), (2, (0, 1))]


def test_a_member_that_joins_later_hands_on_its_own_part() -> None:
    params = DetectorParams()
    tracker = CommTracker("j", "c", 3, params)
    merge = SeqMerge(tracker)
    shard = ShardComm("c", 3)
    shard.ingest(0, 10, (1,), ("allreduce",), (8,), (1,), (5,))
    shard.ingest(1, 10, (1,), ("allreduce",), (8,), (2,), (6,))
    for part in shard.drain():
        merge.add(part)
    assert tracker.ops_seen == 0  # two of three members
    shard.ingest(2, 12, (1,), ("allreduce",), (8,), (3,), (7,))
    (late,) = shard.drain()
    assert late.members == (2,)
    merge.add(late)
    assert tracker.ops_seen == 1
    assert tracker.spans.median() == 4


def _handed_in_order(count: int) -> ShardComm:
    """A shard of two members that handed on ``count`` operations, then one more with a
    third member that joined."""
    shard = ShardComm("c", 3)
    for seq in range(count):
        ts = 10 * (seq + 1)
        for rank in (0, 1):
            shard.ingest(rank, ts, (seq,), ("allreduce",), (8,), (ts,), (ts + 5,))
    ts = 10 * (count + 1)
    for rank in (0, 1, 2):
        shard.ingest(rank, ts, (count,), ("allreduce",), (8,), (ts,), (ts + 5,))
    shard.drain()
    return shard


def test_a_shards_snapshot_keeps_what_it_handed_on_as_runs_not_one_entry_each() -> None:
    shard = _handed_in_order(MAX_COMPLETED + 100)
    state = shard.state()
    # Bounded at MAX_COMPLETED in memory; in the snapshot, one run per members-known count.
    assert len(shard.handed) == MAX_COMPLETED
    assert state["handed_runs"] == [[101, MAX_COMPLETED - 1, 2], [MAX_COMPLETED + 100, 1, 3]]
    restored = ShardComm.restored(orjson.loads(orjson.dumps(state)))
    assert list(restored.handed.items()) == list(shard.handed.items())  # the order too
    assert restored.floor == shard.floor == 101
    # The restored shard drops a re-report of a handed-on operation as the first one does:
    # not opened again (a shard that forgot it would wait there for the other members).
    for each in (shard, restored):
        each.ingest(0, 5, (MAX_COMPLETED,), ("allreduce",), (8,), (1,), (2,))
        assert MAX_COMPLETED not in each.open
        assert each.drain() == []
    forgetful = ShardComm.restored({**state, "handed_runs": []})
    forgetful.ingest(0, 5, (MAX_COMPLETED,), ("allreduce",), (8,), (1,), (2,))
    assert MAX_COMPLETED in forgetful.open


def test_a_shards_snapshot_of_the_first_format_is_still_read() -> None:
    shard = _handed_in_order(5)
    state = shard.state()
    first_format = {key: value for key, value in state.items() if key != "handed_runs"}
    first_format["handed"] = [[seq, known] for seq, known in shard.handed.items()]
    assert ShardComm.restored(first_format).handed == shard.handed


def test_a_shards_snapshot_handing_on_more_than_a_shard_keeps_is_refused() -> None:
    state = _handed_in_order(5).state()
    state["handed_runs"] = [[0, 10**12, 2]]
    with pytest.raises(ValueError, match="in all"):
        ShardComm.restored(state)
    # A negative run must not make room for a huge one after it.
    state["handed_runs"] = [[0, -(10**12), 2], [0, 10**12, 2]]
    with pytest.raises(ValueError, match="-1000000000000 long"):
        ShardComm.restored(state)

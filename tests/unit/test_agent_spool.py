"""The disk spool: order, bound, heartbeats dropped first, survival across a restart."""

from __future__ import annotations

from pathlib import Path

from producers.publisher import is_heartbeat
from producers.spool import DiskSpool, Record
from schemas.messages import Collective, Ops


def record(index: int, heartbeat: bool = False, size: int = 100) -> Record:
    return Record(
        "c4.collective.v1",
        f"job-{index % 3}".encode(),
        b"x" * size + str(index).encode(),
        heartbeat,
    )


def index_of(item: Record) -> int:
    return int(item.value.lstrip(b"x"))


def test_records_come_back_in_order_across_segments_and_a_restart(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    for index in range(50):
        spool.append(record(index, heartbeat=index % 2 == 0))
    assert len(spool) == 50 and len(list(tmp_path.glob("*.seg"))) > 3
    first = spool.take(7)
    assert [index_of(r) for r in first] == list(range(7))
    assert first[0].heartbeat and not first[1].heartbeat and first[0].key == b"job-0"
    spool.close()

    reopened = DiskSpool(tmp_path, max_bytes=1 << 20, segment_bytes=1000)
    assert len(reopened) == 43
    rest = reopened.take(100)
    assert [index_of(r) for r in rest] == list(range(7, 50))
    assert len(reopened) == 0 and reopened.bytes == 0
    assert list(tmp_path.glob("*.seg")) == []


def test_a_torn_frame_at_the_end_is_cut_off(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path)
    for index in range(3):
        spool.append(record(index))
    spool.close()
    (segment,) = tmp_path.glob("*.seg")
    segment.write_bytes(segment.read_bytes()[:-10])  # a crash in the middle of a write
    reopened = DiskSpool(tmp_path)
    assert [index_of(r) for r in reopened.take(10)] == [0, 1]


def test_when_full_the_oldest_heartbeats_go_first_and_are_counted(tmp_path: Path) -> None:
    size = record(0).size
    spool = DiskSpool(tmp_path, max_bytes=size * 10, segment_bytes=size * 3)
    for index in range(10):
        spool.append(record(index, heartbeat=index in (1, 2, 6, 8)))
    spool.append(record(10))  # one over: the oldest heartbeats make room
    assert spool.counts.dropped_heartbeats >= 1 and spool.counts.dropped_records == 0
    kept = [index_of(r) for r in spool.take(100)]
    assert kept[-1] == 10 and kept == sorted(kept)
    assert {0, 3, 4, 5, 7, 9} <= set(kept)  # data is kept while heartbeats can go
    assert 1 not in kept
    assert spool.bytes == 0


def test_without_heartbeats_the_oldest_records_go(tmp_path: Path) -> None:
    size = record(0).size
    spool = DiskSpool(tmp_path, max_bytes=size * 5, segment_bytes=size * 2)
    for index in range(8):
        spool.append(record(index))
    assert spool.counts.dropped_records == 3 and spool.counts.dropped_heartbeats == 0
    assert [index_of(r) for r in spool.take(100)] == [3, 4, 5, 6, 7]
    spool.append(record(0, size=size * 10))  # larger than the whole spool: dropped, counted
    assert spool.counts.dropped_records == 4 and len(spool) == 0


def test_bytes_track_what_waits(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path)
    spool.append(record(1))
    spool.append(record(2, size=10))
    assert spool.bytes == record(1).size + record(2, size=10).size
    spool.take(1)
    assert spool.bytes == record(2, size=10).size


def test_heartbeats_are_collectives_with_empty_ops() -> None:
    def collective(ops: Ops) -> Collective:
        return Collective(
            v=1,
            kind="collective",
            job="j",
            comm="c",
            comm_size=1,
            rank=0,
            global_rank=0,
            ts_ns=1,
            ops=ops,
        )

    empty = Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=())
    one = Ops(seq=(1,), op=("barrier",), bytes=(0,), enter_ns=(1,), end_ns=(None,))
    assert is_heartbeat(collective(empty))
    assert not is_heartbeat(collective(one))

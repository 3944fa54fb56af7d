"""The disk spool: order, bound, heartbeats dropped first, survival across a restart."""

from __future__ import annotations

from pathlib import Path

import orjson

from producers.publisher import is_heartbeat
from producers.spool import DiskSpool, Record
from schemas.codec import encode
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
        return Collective.of(
            job="j", comm="c", comm_size=1, rank=0, global_rank=0, ts_ns=1, ops=ops
        )

    empty = Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=())
    one = Ops(seq=(1,), op=("barrier",), bytes=(0,), enter_ns=(1,), end_ns=(None,))
    assert is_heartbeat(collective(empty))
    assert not is_heartbeat(collective(one))


def test_publisher_spools_while_no_broker_answers_and_drops_heartbeats_first(
    tmp_path: Path,
) -> None:
    import socket
    import time

    from producers.publisher import Publisher

    def collective(index: int, heartbeat: bool) -> Collective:
        ops = (
            Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=())
            if heartbeat
            else Ops(seq=(index,), op=("barrier",), bytes=(0,), enter_ns=(index,), end_ns=(index,))
        )
        return Collective.of(
            job="j", comm="c", comm_size=1, rank=0, global_rank=0, ts_ns=index, ops=ops
        )

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    size = Record("c4.collective.v1", b"j", encode(collective(10, False))).size
    spool = DiskSpool(tmp_path, max_bytes=size * 14, segment_bytes=size * 2)
    publisher = Publisher({"bootstrap.servers": f"127.0.0.1:{port}"}, "", spool, stall_s=0.2)
    publisher.publish(collective(0, True))  # queued in librdkafka before the outage is seen
    deadline = time.monotonic() + 30
    while not publisher.down and time.monotonic() < deadline:
        publisher.service()
        time.sleep(0.05)
    assert publisher.down
    for index in range(1, 21):
        publisher.publish(collective(index, heartbeat=index % 2 == 0))
    counts = publisher.counts
    assert counts.outages == 1 and counts.spooled >= 20  # message 0 too, if it came later
    assert counts.dropped_heartbeats > 0 and counts.dropped_records == 0
    assert publisher.close(0.5) > 0
    kept = DiskSpool(tmp_path).take(100)
    indexes = [int(orjson.loads(record.value)["ts_ns"]) for record in kept]
    assert indexes[0] == 0  # what librdkafka still held went back to the spool, in front,
    assert kept[0].heartbeat  # still flagged a heartbeat (the publisher kept the flag)
    assert indexes == sorted(indexes)  # in publishing order
    assert set(range(1, 21, 2)) <= set(indexes)  # every data message kept; heartbeats went
    assert not any(
        record.heartbeat for record in kept if int(orjson.loads(record.value)["ts_ns"]) % 2
    )


def test_records_handed_back_go_in_front_of_the_oldest(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, segment_bytes=300)
    for index in range(10, 20):
        spool.append(record(index))
    assert [index_of(r) for r in spool.take(3)] == [10, 11, 12]
    spool.prepend([record(index) for index in range(3)])
    spool.close()
    reopened = DiskSpool(tmp_path, segment_bytes=300)
    assert len(reopened) == 10
    assert [index_of(r) for r in reopened.take(100)] == [0, 1, 2, *range(13, 20)]

"""Broker outage: Kafka killed for 15 s while the agent publishes; nothing lost or doubled."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from producers.handoff import FolderSink
from producers.publisher import Publisher
from producers.spool import DiskSpool
from schemas.codec import decode
from schemas.messages import Collective, Collectives, Ops
from tests.integration.private_stack import PrivateStack

BASE_NS = 1_800_000_000_000_000_000
JOBS = 6
RATE_PER_S = 40
BEFORE_S, OUTAGE_S, AFTER_S = 5.0, 15.0, 5.0


def _message(index: int) -> Collective:
    """Message ``index``: a heartbeat every third one; ``ts_ns`` says which it is."""
    heartbeat = index % 3 == 2
    ops = (
        Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=())
        if heartbeat
        else Ops(
            seq=(index,),
            op=("allreduce",),
            bytes=(1024,),
            enter_ns=(BASE_NS + index,),
            end_ns=(BASE_NS + index,),
        )
    )
    return Collective(
        v=1,
        kind="collective",
        job=f"job-{index % JOBS}",
        comm="c",
        comm_size=1,
        rank=0,
        global_rank=0,
        ts_ns=BASE_NS + index,
        ops=ops,
    )


def is_presence(message: object) -> bool:
    """The agent saying its node is up while the handed-off ranks are silent (no message)."""
    return isinstance(message, Collectives) and message.messages == ()


def _consume_all(bootstrap: str, topic: str, expected: int) -> dict[int, list[int]]:
    """Every message's index, per partition in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-check",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    metadata = consumer.list_topics(topic, timeout=20)
    partitions = list(metadata.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen: dict[int, list[int]] = defaultdict(list)
    total = 0
    deadline = time.monotonic() + 60
    while total < expected and time.monotonic() < deadline:
        for record in consumer.consume(1000, timeout=1.0):
            assert record.error() is None, record.error()
            message = decode(record.value())
            if is_presence(message):
                continue
            assert isinstance(message, Collective), message
            seen[record.partition()].append(message.ts_ns - BASE_NS)
            total += 1
    # Anything beyond the expected count (a duplicate) shows up within a short extra wait.
    for record in consumer.consume(1000, timeout=3.0):
        message = decode(record.value())
        if is_presence(message):
            continue
        assert isinstance(message, Collective), message
        seen[record.partition()].append(message.ts_ns - BASE_NS)
    consumer.close()
    return seen


def test_broker_killed_for_15_s_every_message_arrives_once_in_order(
    private_stack: PrivateStack, unique: str, tmp_path: Path
) -> None:
    prefix = f"outage-{unique}."
    topic = prefix + "c4.collective.v1"
    spool = DiskSpool(tmp_path / "spool", max_bytes=64 << 20)
    publisher = Publisher(
        {"bootstrap.servers": private_stack.bootstrap}, prefix, spool, stall_s=2.0
    )
    sent = 0
    restarted = threading.Event()

    def restart() -> None:
        private_stack.start()
        restarted.set()

    started = time.monotonic()
    killed = False
    restarter: threading.Thread | None = None
    total_s = BEFORE_S + OUTAGE_S + AFTER_S
    while True:
        elapsed = time.monotonic() - started
        if not killed and elapsed >= BEFORE_S:
            private_stack.stop("kafka")
            killed = True
        if restarter is None and elapsed >= BEFORE_S + OUTAGE_S:
            restarter = threading.Thread(target=restart)
            restarter.start()
        if restarter is not None and restarted.is_set() and elapsed >= total_s:
            break
        due = int(elapsed * RATE_PER_S)
        while sent < due:
            publisher.publish(_message(sent))
            sent += 1
        publisher.service()
        time.sleep(0.01)
    assert restarter is not None
    restarter.join()
    publisher.flush(120)

    counts = publisher.counts
    assert counts.outages >= 1
    assert counts.spooled > OUTAGE_S * RATE_PER_S * 0.8  # the outage went to the spool
    assert counts.replayed == counts.spooled
    assert counts.dropped_heartbeats == counts.dropped_records == 0
    assert counts.delivered == sent and counts.failed == 0

    seen = _consume_all(private_stack.bootstrap, topic, sent)
    indexes = [index for per_partition in seen.values() for index in per_partition]
    assert len(indexes) == sent  # no loss, no duplicate
    assert sorted(indexes) == list(range(sent))
    for per_partition in seen.values():
        assert per_partition == sorted(per_partition)  # published order kept per partition


def _start_agent(
    handoff: Path, spool: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [
                sys.executable,
                "-m",
                "c4.cli",
                "agent",
                "--handoff",
                str(handoff),
                "--no-sysfs",
                "--no-nvml",
                "--interval",
                "0.2",
                "--spool-dir",
                str(spool),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_agent_killed_three_times_loses_nothing_it_was_handed(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    prefix = f"agentkill-{unique}."
    env = dict(os.environ, C4_KAFKA_BOOTSTRAP=kafka_bootstrap, C4_TOPIC_PREFIX=prefix)
    handoff, spool, log = tmp_path / "handoff", tmp_path / "spool", tmp_path / "agent.log"
    sink = FolderSink(handoff, "trainer", max_bytes=16 << 10)  # rotates every ~60 messages
    agent = _start_agent(handoff, spool, env, log)
    written = 0
    started = time.monotonic()
    kills = [2.0, 4.5, 7.0]
    while (elapsed := time.monotonic() - started) < 9.0:
        if kills and elapsed >= kills[0]:
            kills.pop(0)
            agent.kill()  # kill -9: whatever it had read but not delivered is read again
            agent.wait(10)
            agent = _start_agent(handoff, spool, env, log)
        due = int(elapsed * RATE_PER_S * 5)
        sink([_message(index) for index in range(written, due)])
        written = max(written, due)
        time.sleep(0.02)
    sink.close()
    seen = _consume_all(kafka_bootstrap, prefix + "c4.collective.v1", written)
    agent.terminate()
    assert agent.wait(30) == 0, log.read_text()
    indexes = [index for per_partition in seen.values() for index in per_partition]
    assert set(indexes) == set(range(written)), "a message handed to the agent was lost"
    repeated = len(indexes) - written
    print(f"{written} messages through 3 kills of the agent; {repeated} read again")
    # Only what was read after the last commit (about one round) comes again.
    assert repeated <= 3 * RATE_PER_S * 5
    assert len(list(handoff.iterdir())) <= 2  # delivered files were deleted

"""``c4 agent`` publishing a sysfs tree and a torch handoff folder to the real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from producers.handoff import FolderSink
from producers.oplog import END, OpRecorder
from schemas.codec import decode
from schemas.messages import Collective, Collectives, Link, Links
from schemas.records import decode_record

T0 = 1_800_000_000_000_000_000


def _consume(bootstrap: str, topic: str, at_least: int) -> list[object]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"{topic}-check", "enable.auto.commit": False}
    )
    partitions = consumer.list_topics(topic, timeout=20).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    found: list[object] = []
    deadline = time.monotonic() + 30
    while len(found) < at_least and time.monotonic() < deadline:
        for record in consumer.consume(100, timeout=1.0):
            assert record.error() is None, record.error()
            found.append(decode(record.value()))
    consumer.close()
    return found


def test_agent_publishes_links_and_handed_off_collectives(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "counters/port_xmit_data").write_text("10\n")
    (port / "counters/port_rcv_data").write_text("20\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    recorder = OpRecorder(f"job-{unique}", node="node-005", gpu=1)
    recorder.comm("0", 8, 5, 5).enter("allreduce", 4096, T0)[END] = T0 + 1000
    sink = FolderSink(tmp_path / "handoff", "rank5")
    sink(recorder.messages(T0 + 5000))
    sink.close()

    prefix = f"agentcli-{unique}."
    env = {**os.environ, "C4_KAFKA_BOOTSTRAP": kafka_bootstrap, "C4_TOPIC_PREFIX": prefix}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "c4.cli",
            "agent",
            "--node",
            "node-005",
            "--no-nvml",
            "--sysfs-root",
            str(tmp_path / "sys"),
            "--handoff",
            str(tmp_path / "handoff"),
            "--spool-dir",
            str(tmp_path / "spool"),
            "--duration",
            "2.5",
            "--link-interval",
            "1",
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert b"failed 0" in result.stderr and b"0 not yet delivered" in result.stderr

    links = _consume(kafka_bootstrap, prefix + "c4.link.v1", 2)
    assert len(links) >= 2 and all(isinstance(m, Link) for m in links)
    assert {(m.node, m.port, m.counters.tx_bytes) for m in links if isinstance(m, Link)} == {
        ("node-005", "mlx5_0:1", 40)
    }
    collective, *later = _consume(kafka_bootstrap, prefix + "c4.collective.v1", 1)
    assert isinstance(collective, Collective)
    # The rank silent after that, the agent says its node is up (presence: no messages).
    assert all(
        isinstance(m, Collectives) and m.messages == () and m.node == "node-005" for m in later
    ), later
    assert (collective.comm, collective.rank, collective.ops.seq) == ("0", 5, (0,))


def test_agent_with_batch_publishes_one_links_record_per_round_keyed_by_its_node(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    for device in ("mlx5_0", "mlx5_1"):
        port = tmp_path / f"sys/class/infiniband/{device}/ports/1"
        (port / "counters").mkdir(parents=True)
        (port / "counters/port_xmit_data").write_text("10\n")
        (port / "state").write_text("4: ACTIVE\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    prefix = f"agentbatch-{unique}."
    env = {**os.environ, "C4_KAFKA_BOOTSTRAP": kafka_bootstrap, "C4_TOPIC_PREFIX": prefix}
    result = subprocess.run(
        [
            sys.executable, "-m", "c4.cli", "agent", "--batch", "--node", "node-006",
            "--no-nvml", "--sysfs-root", str(tmp_path / "sys"), "--spool-dir",
            str(tmp_path / "spool"), "--duration", "1.5", "--link-interval", "1",
        ],
        env=env,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert b"failed 0" in result.stderr and b"0 not yet delivered" in result.stderr

    topic = prefix + "c4.link.v1"
    settings = {"bootstrap.servers": kafka_bootstrap, "group.id": f"{topic}-check"}
    consumer = Consumer({**settings, "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=20).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    records = []
    deadline = time.monotonic() + 30
    while len(records) < 2 and time.monotonic() < deadline:
        records.extend(consumer.consume(100, timeout=1.0))
    consumer.close()
    assert len(records) >= 2  # two rounds in 1.5 s, one record each
    for record in records:
        assert record.error() is None and record.key() == b"node-006"
        batch = decode(record.value())
        assert isinstance(batch, Links) and batch.node == "node-006"
        elements = decode_record(record.value(), "link")
        assert [(m.node, m.port) for m in elements if isinstance(m, Link)] == [
            ("node-006", "mlx5_0:1"), ("node-006", "mlx5_1:1")
        ]  # fmt: skip

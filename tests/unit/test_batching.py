"""Packing collective messages into batches: nothing lost, reordered or changed in meaning."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from producers.agent import Agent
from producers.batching import MAX_BATCH_BYTES, pack_round, pack_stream
from producers.publisher import Publisher, is_heartbeat
from producers.sources import Reading
from producers.spool import DiskSpool
from schemas.base import C4Model
from schemas.codec import encode
from schemas.messages import (
    Collective,
    Collectives,
    Gpu,
    Gpus,
    Link,
    LinkCounters,
    Links,
    Neighbours,
    Ops,
)
from schemas.records import decode_record
from simulator import scenario_from, simulate
from tests.contract import contract_examples

EMPTY = Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=())


def collective(job: str, rank: int, ops: int = 0, ts_ns: int = 10) -> Collective:
    return Collective.of(
        job=job,
        comm="c",
        comm_size=4096,
        rank=rank,
        global_rank=rank,
        ts_ns=ts_ns,
        ops=Ops(
            seq=tuple(range(ops)),
            op=("allreduce",) * ops,
            bytes=(1 << 20,) * ops,
            enter_ns=(1_733_130_000_000_000_000,) * ops,
            end_ns=(1_733_130_000_100_000_000,) * ops,
        ),
    )


def unpacked(messages: list[C4Model]) -> list[C4Model]:
    """The messages as a reader takes them: each batch's elements in its place."""
    batches = Collectives | Links | Gpus
    return [m for b in messages for m in (b.messages if isinstance(b, batches) else (b,))]


def test_a_round_is_packed_per_job_in_place_and_in_order() -> None:
    other = decode_record(orjson.dumps(contract_examples()["neighbours"]))[0]
    round_ = [collective("a", 0), collective("b", 0), other, collective("a", 1)]
    packed = pack_round(round_, node="node-001")
    assert [type(m).__name__ for m in packed] == ["Collectives", "Collectives", "Neighbours"]
    first, second = packed[0], packed[1]
    assert isinstance(first, Collectives) and isinstance(second, Collectives)
    assert [m.rank for m in first.messages] == [0, 1] and first.job == "a"
    assert first.node == "node-001" and second.job == "b"
    assert sorted(map(encode, unpacked(packed))) == sorted(map(encode, round_))


def test_a_large_round_is_cut_into_records_under_the_size_bound() -> None:
    round_ = [collective("a", rank, ops=40) for rank in range(600)]
    packed = pack_round(round_)
    assert len(packed) > 1
    for batch in packed:
        assert len(encode(batch)) <= MAX_BATCH_BYTES * 1.25
    assert unpacked(packed) == round_


def test_a_packed_simulated_run_carries_every_message_and_no_later_one_overtakes() -> None:
    scenario = scenario_from(
        {
            "seed": 5,
            "duration_s": 5,
            "jobs": [
                {"id": "job-1", "ranks": 32, "parallel": {"tp": 8, "pp": 2}},
                {"id": "job-2", "ranks": 16},
            ],
        }
    )
    messages = list(simulate(None, scenario))
    packed = list(pack_stream(messages))
    singles = sum(isinstance(m, Collective) for m in messages)
    assert sum(isinstance(m, Collectives) for m in packed) * 4 <= singles
    assert not any(isinstance(m, Collective) for m in packed)
    assert sorted(map(encode, unpacked(packed))) == sorted(map(encode, messages))
    times = [int(getattr(m, "ts_ns", 0)) for m in packed if not hasattr(m, "state")]
    assert times == sorted(times)  # event time never goes back
    for batch in packed:
        if isinstance(batch, Collectives):
            assert {m.job for m in batch.messages} == {batch.job}
            assert {m.node for m in batch.messages} == {batch.node}
            wire = encode(batch)
            assert decode_record(wire, "collective") == list(batch.messages)


def test_replaying_the_packed_run_finds_what_the_unpacked_run_finds(tmp_path: Path) -> None:
    scenario = {
        "seed": 7,
        "duration_s": 40,
        "jobs": [{"id": "job-1", "ranks": 32, "parallel": {"tp": 8, "pp": 2}}],
        "faults": [{"type": "slow_gpu", "job": "job-1", "rank": 9, "at_s": 15, "factor": 1.5}],
    }
    spec = tmp_path / "scenario.json"
    spec.write_bytes(orjson.dumps(scenario))
    found = {}
    for name, extra in (("single", []), ("packed", ["--batch"])):
        out = tmp_path / f"{name}.jsonl"
        c4("simulate", "--scenario", str(spec), "--out", str(out), *extra)
        found[name] = c4("diagnose", str(out))
    packed_lines = (tmp_path / "packed.jsonl").read_bytes().count(b'"kind":"collectives"')
    assert packed_lines > 0
    assert found["packed"] == found["single"]
    assert b'"noncomm_slow"' in found["single"]


def c4(*args: str) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "c4.cli", *args], capture_output=True, timeout=300, check=True
    )
    return done.stdout


def test_collective_of_fills_the_version_and_kind() -> None:
    message = collective("a", 3, ops=2)
    assert (message.v, message.kind) == (1, "collective")
    assert encode(message).startswith(b'{"v":1,"kind":"collective",')
    fields = {name: getattr(message, name) for name in ("job", "comm", "comm_size", "rank")}
    fields |= {"global_rank": 3, "ts_ns": message.ts_ns, "ops": message.ops}
    assert Collective.of(**fields, trusted=True) == message  # the same, unvalidated
    with pytest.raises(ValidationError, match="comm_size"):
        Collective.of(**(fields | {"comm_size": 3}))  # rank 3 of 3: validated
    assert Collective.of(**(fields | {"comm_size": 3}), trusted=True).rank == 3


def test_a_batch_of_heartbeats_is_a_heartbeat_and_one_with_work_is_not() -> None:
    beats = pack_round([collective("a", 0), collective("a", 1)])[0]
    busy = pack_round([collective("a", 0), collective("a", 1, ops=2)])[0]
    assert is_heartbeat(beats) and not is_heartbeat(busy)
    assert is_heartbeat(collective("a", 0)) and not is_heartbeat(collective("a", 0, ops=1))


def test_records_purged_from_the_queue_go_back_to_the_spool_still_flagged(tmp_path: Path) -> None:
    beats = pack_round([collective("a", 0), collective("a", 1)])[0]
    busy = pack_round([collective("a", 0), collective("a", 1, ops=2)])[0]
    published = [beats, busy, collective("a", 0), collective("a", 0, ops=1)]
    with socket.socket() as silent:  # a broker that takes connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        bootstrap = f"127.0.0.1:{silent.getsockname()[1]}"
        publisher = Publisher({"bootstrap.servers": bootstrap}, "", DiskSpool(tmp_path))
        for message in published:
            publisher.publish(message)
        assert publisher.in_flight() == len(published)  # all in librdkafka, none spooled
        assert publisher.close(0.0) == len(published)
    back = DiskSpool(tmp_path).take(10)
    assert [record.value for record in back] == [encode(m) for m in published]
    assert [record.heartbeat for record in back] == [True, False, True, False]


class Round:
    name, interval_s = "ranks", 1.0

    def read(self, now_ns: int) -> Reading:
        return Reading(messages=[collective("j", rank, ops=1, ts_ns=now_ns) for rank in range(8)])

    def close(self) -> None:
        pass


def test_the_agent_sends_one_record_per_job_per_round_unless_told_not_to() -> None:
    for pack, records in ((True, 1), (False, 8)):  # packing is opt-in
        sent: list[C4Model] = []
        agent = Agent([Round()], sent.append, print, clock_ns=lambda: 5, pack=pack, node="n1")
        assert agent.run_once() == 8 and agent.counts.messages == 8
        assert len(sent) == records
        assert len(unpacked(sent)) == 8


class Silent:
    """A source whose ranks of job "j" on node n1 report until told to stop."""

    name, interval_s = "ranks", 1.0

    def __init__(self) -> None:
        self.reporting = True

    def read(self, now_ns: int) -> Reading:
        if not self.reporting:
            return Reading()
        return Reading(messages=[collective("j", rank, ops=1, ts_ns=now_ns) for rank in range(2)])

    def close(self) -> None:
        pass


def test_an_agent_says_its_node_is_up_while_the_job_s_ranks_there_are_silent() -> None:
    source, sent, now = Silent(), list[C4Model](), [0.0]
    agent = Agent(
        [source], sent.append, print, clock_ns=lambda: 7, monotonic=lambda: now[0],
        node="n1", presence_s=30.0,
    )  # fmt: skip
    agent.run_once()
    assert len(sent) == 2 and all(isinstance(m, Collective) for m in sent)
    source.reporting = False
    sent.clear()
    for now[0] in (1.0, 2.0, 30.0):
        agent.run_once()
    assert (
        sent == [Collectives(v=1, kind="collectives", job="j", node="n1", ts_ns=7, messages=())] * 3
    )
    # Past presence_s without a word from the ranks: the job is gone from this node.
    sent.clear()
    now[0] = 31.0
    agent.run_once()
    assert sent == []
    # The presence reads back as that envelope; an empty batch naming no node, as nothing.
    (up,) = decode_record(
        encode(Collectives(v=1, kind="collectives", job="j", node="n1", ts_ns=7, messages=())),
        "collective",
    )
    assert isinstance(up, Collectives) and up.node == "n1" and up.messages == ()
    assert decode_record(b'{"v":1,"kind":"collectives","job":"j","ts_ns":7,"messages":[]}') == []


def link(node: str, port: str, ts_ns: int = 10, counters: int = 0) -> Link:
    values = dict.fromkeys(tuple(LinkCounters.model_fields)[:counters], 10**19)
    return Link(
        v=1, kind="link", node=node, port=port, ts_ns=ts_ns, state="up",
        counters=LinkCounters(**values),
    )  # fmt: skip


def gpu(node: str, index: int, ts_ns: int = 10, xids: int = 0) -> Gpu:
    return Gpu(v=1, kind="gpu", node=node, gpu=index, ts_ns=ts_ns, xid=(79,) * xids)


def neighbours(node: str, ts_ns: int = 10) -> Neighbours:
    return Neighbours(v=1, kind="neighbours", node=node, ts_ns=ts_ns, ports=())


def shape(messages: list[C4Model]) -> list[tuple[str, str]]:
    """Each record's kind and whose it is (a job, or a node)."""
    return [(kind_of(m), str(getattr(m, "job", None) or getattr(m, "node", ""))) for m in messages]


def kind_of(message: C4Model) -> str:
    return str(getattr(message, "kind", ""))


def test_a_round_packs_each_node_s_links_and_gpus_where_its_first_one_was() -> None:
    round_ = [
        link("n1", "p0"), gpu("n1", 0), collective("a", 0), link("n2", "p0"),
        link("n1", "p1"), neighbours("n1"), gpu("n1", 1), collective("a", 1),
    ]  # fmt: skip
    packed = pack_round(round_, node="n1")
    assert shape(packed) == [
        ("links", "n1"), ("gpus", "n1"), ("collectives", "a"), ("links", "n2"), ("neighbours", "n1")
    ]  # fmt: skip
    first, second = packed[0], packed[1]
    assert isinstance(first, Links) and [m.port for m in first.messages] == ["p0", "p1"]
    assert isinstance(second, Gpus) and [m.gpu for m in second.messages] == [0, 1]
    assert sorted(map(encode, unpacked(packed))) == sorted(map(encode, round_))
    for batch in packed:  # each reads back as its messages, from its own topic
        if isinstance(batch, Links | Gpus):
            kind = "link" if isinstance(batch, Links) else "gpu"
            assert decode_record(encode(batch), kind) == list(batch.messages)


def test_link_and_gpu_batches_are_cut_at_the_message_count_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("producers.batching.MAX_BATCH_MESSAGES", 3)
    round_: list[C4Model] = [link("n1", f"p{i}") for i in range(7)]
    round_ += [gpu("n1", i) for i in range(4)]
    packed = pack_round(round_)
    assert [len(getattr(b, "messages", ())) for b in packed] == [3, 3, 1, 3, 1]
    assert [kind_of(m) for m in packed] == ["links"] * 3 + ["gpus"] * 2
    assert unpacked(packed) == round_
    streamed = list(pack_stream(round_))
    assert [encode(b) for b in streamed] == [encode(b) for b in packed]


def test_a_node_s_many_ports_and_gpus_are_cut_into_records_under_the_size_bound() -> None:
    round_: list[C4Model] = [link("n1", f"mlx5_{i}:1", counters=12) for i in range(2000)]
    round_ += [gpu("n1", i, xids=200) for i in range(2000)]
    packed = pack_round(round_)
    assert [kind_of(m) for m in packed].count("links") > 1 and [kind_of(m) for m in packed].count(
        "gpus"
    ) > 1
    for batch in packed:
        assert len(encode(batch)) <= MAX_BATCH_BYTES
    assert unpacked(packed) == round_


def test_a_stream_s_batches_take_their_first_message_s_place_and_wait_for_nothing_later() -> None:
    stream = [
        neighbours("n0", ts_ns=5),
        collective("a", 0, ts_ns=10), link("n1", "p0"), neighbours("n1"), gpu("n1", 0),
        link("n2", "p0"), link("n1", "p1"), gpu("n1", 1), collective("a", 1, ts_ns=10),
        neighbours("n3", ts_ns=20), link("n1", "p0", ts_ns=20), link("n1", "p1", ts_ns=20),
        link("n1", "p0", ts_ns=30),
    ]  # fmt: skip
    packed = list(pack_stream(stream))
    assert shape(packed) == [
        ("neighbours", "n0"),
        ("collectives", "a"), ("links", "n1"), ("neighbours", "n1"), ("gpus", "n1"),
        ("links", "n2"),
        ("neighbours", "n3"), ("links", "n1"),
        ("links", "n1"),
    ]  # fmt: skip
    assert [int(getattr(m, "ts_ns", 0)) for m in packed] == [5, 10, 10, 10, 10, 10, 20, 20, 30]
    assert [len(m.messages) for m in packed if isinstance(m, Links)] == [2, 1, 2, 1]
    assert sorted(map(encode, unpacked(packed))) == sorted(map(encode, stream))


def test_a_packed_simulated_run_reads_as_the_unpacked_run_element_by_element() -> None:
    scenario = scenario_from(
        {
            "seed": 5,
            "duration_s": 12,
            "jobs": [{"id": "job-1", "ranks": 32, "parallel": {"tp": 8, "pp": 2}}],
            "faults": [{"type": "gpu_stop", "job": "job-1", "rank": 3, "at_s": 4}],
        }
    )
    messages = list(simulate(None, scenario))
    packed = list(pack_stream(messages))
    assert not any(isinstance(m, Collective | Link | Gpu) for m in packed)
    links = sum(isinstance(m, Link) for m in messages)
    assert sum(isinstance(m, Links) for m in packed) * 8 <= links
    assert [encode(m) for m in unpacked(packed)] == [encode(m) for m in messages]
    for batch in packed:
        if isinstance(batch, Links | Gpus):
            assert {(m.node, m.ts_ns) for m in batch.messages} == {(batch.node, batch.ts_ns)}


def test_replaying_a_packed_run_with_hardware_faults_finds_what_the_unpacked_run_finds(
    tmp_path: Path,
) -> None:
    # A node_down's detection time depends on the element order within one instant: with
    # a node's collectives batch behind its link reports, it came 0.45 s late.
    scenario = {
        "seed": 3,
        "duration_s": 50,
        "jobs": [
            {"id": "job-1", "ranks": 32, "parallel": {"tp": 8, "pp": 2}},
            {"id": "job-2", "ranks": 16},
        ],
        "faults": [
            {
                "type": "port_degraded", "node": "node-001", "port": "mlx5_2:1", "at_s": 8,
                "until_s": 20, "factor": 0.4, "symbol_err_per_s": 50,
            },
            {"type": "node_down", "node": "node-004", "at_s": 20},
            {"type": "process_stuck", "job": "job-1", "rank": 17, "at_s": 30},
        ],
    }  # fmt: skip
    spec = tmp_path / "scenario.json"
    spec.write_bytes(orjson.dumps(scenario))
    found = {}
    for name, extra in (("single", []), ("packed", ["--batch"])):
        out = tmp_path / f"{name}.jsonl"
        c4("simulate", "--scenario", str(spec), "--out", str(out), *extra)
        found[name] = c4("diagnose", str(out))
    packed = (tmp_path / "packed.jsonl").read_bytes()
    assert b'"kind":"links"' in packed and b'"kind":"gpus"' in packed
    singles = (b'{"v":1,"kind":"link",', b'{"v":1,"kind":"gpu",')
    assert not any(line.startswith(singles) for line in packed.splitlines())
    assert found["packed"] == found["single"]
    for finding in (b"link_degraded", b"node_down", b"noncomm_hang"):
        assert b'"class":"' + finding + b'"' in found["single"]


def test_the_publisher_sends_a_node_s_batch_to_its_topic_keyed_by_the_node(
    tmp_path: Path,
) -> None:
    links = pack_round([link("node-007", "p0"), link("node-007", "p1")])[0]
    gpus = pack_round([gpu("node-007", 0), gpu("node-007", 1)])[0]
    published = [links, gpus, link("node-007", "p0"), gpu("node-007", 0)]
    with socket.socket() as silent:  # a broker that takes connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        bootstrap = f"127.0.0.1:{silent.getsockname()[1]}"
        publisher = Publisher({"bootstrap.servers": bootstrap}, "staging.", DiskSpool(tmp_path))
        for message in published:
            publisher.publish(message)
        assert publisher.close(0.0) == len(published)
    back = DiskSpool(tmp_path).take(10)  # in order per topic (librdkafka purges by topic)
    assert sorted((r.topic, r.key, r.value) for r in back) == sorted(
        [
            ("staging.c4.link.v1", b"node-007", encode(links)),
            ("staging.c4.gpu.v1", b"node-007", encode(gpus)),
            ("staging.c4.link.v1", b"node-007", encode(published[2])),
            ("staging.c4.gpu.v1", b"node-007", encode(published[3])),
        ]
    )
    assert not any(record.heartbeat for record in back)


class Ports:
    """A source of node n1's two ports and two GPUs, as the sysfs and NVML sources read them."""

    name, interval_s = "ports", 1.0

    def read(self, now_ns: int) -> Reading:
        return Reading(
            messages=[link("n1", "p0", now_ns), link("n1", "p1", now_ns), gpu("n1", 0, now_ns),
                      gpu("n1", 1, now_ns)]
        )  # fmt: skip

    def close(self) -> None:
        pass


def test_the_agent_sends_one_links_and_one_gpus_record_per_round_only_when_batching() -> None:
    for pack, kinds in ((True, ["links", "gpus"]), (False, ["link", "link", "gpu", "gpu"])):
        sent: list[C4Model] = []
        agent = Agent([Ports()], sent.append, print, clock_ns=lambda: 5, pack=pack, node="n1")
        assert agent.run_once() == 4 and agent.counts.messages == 4
        assert [kind_of(m) for m in sent] == kinds
        assert unpacked(sent) == Ports().read(5).messages

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
from schemas.messages import Collective, Collectives, Gpus, Links, Ops
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

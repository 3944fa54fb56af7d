"""The stages of one job's detection on Kafka, their records moved by hand: the forwarder,
node stages per partition and the job stage's gate (`streams.core.relay`) find what one
detector finds, the same whatever the number of node-stage partitions, with the records
of the partitions interleaved in any order, shares delivered twice, and node stages
restarted from their snapshots."""

from __future__ import annotations

import random
import zlib
from collections import deque
from dataclasses import dataclass, field

import msgspec
import orjson
import pytest

from schemas.base import C4Model
from schemas.codec import encode
from schemas.messages import Collective, Collectives, Diagnosis, Job, Member
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import FAULT_TYPES
from streams.core.barriers import ShareGate
from streams.core.engine import Engine
from streams.core.relay import Forwarder, JobSide, NodeSide, Outgoing, job_of_key
from streams.core.share_wire import (
    FORGET,
    RUN,
    Mark,
    ShareRecord,
    WireError,
    decode_mark,
    decode_share,
    encode_share,
)
from streams.core.split import JobShare, NodeStage
from tests.unit.suite_cases import suite_case


def _partition(key: bytes, partitions: int) -> int:
    return zlib.crc32(key) % partitions


@dataclass
class _Split:
    """The stages with their topics as in-memory logs."""

    engine: Engine
    partitions: int
    rng: random.Random | None = None  # None: every record handled as soon as it is written
    redeliver: float = 0.0  # the share of share records delivered twice
    restart_chance: float = 0.0  # after each record, the chance its node stage's worker dies
    logs: list[list[tuple[Outgoing, int]]] = field(default_factory=list)
    read: list[int] = field(default_factory=list)
    shares: deque[bytes] = field(default_factory=deque)
    found: list[Diagnosis] = field(default_factory=list)
    position: int = 0
    barriers: int = 0
    restarts: int = 0
    hold_shares: bool = False  # the shares left for the test to hand the job stage
    snapshot_every: int = 1  # a node stage's snapshot of a job kept at every n-th barrier

    def __post_init__(self) -> None:
        partitions = self.partitions
        self.forwarder = Forwarder(
            self.engine.params.tick_ns, partitions, lambda key: _partition(key, partitions)
        )
        self.nodes = NodeSide()
        self.job_side = JobSide(self.partitions)
        self.logs = [[] for _ in range(self.partitions)]
        self.read = [0] * self.partitions
        self.saved: dict[tuple[int, str], dict[str, object]] = {}
        self.committed = [0] * self.partitions  # what each partition's reader committed
        self.marked: dict[tuple[int, str], int] = {}  # barriers handed on per (partition, job)

    def write(self, outgoing: list[Outgoing], position: int) -> None:
        for out in outgoing:
            self.logs[out.partition].append((out, position))

    def feed(self, message: C4Model) -> None:
        if isinstance(message, Collective | Collectives):
            self.position += 1
            self.write(self.forwarder.forward(encode(message), message.job), self.position)
        else:
            if isinstance(message, Member):
                self.write(self.forwarder.to_all(Mark(RUN, message.job, message.restart)), 0)
            if isinstance(message, Job) and message.state == "stopped":
                self.forwarder.forget(message.job)
                self.write(self.forwarder.to_all(Mark(FORGET, message.job)), 0)
            self.found.extend(self.engine.on_message(message))
        self.pump(everything=self.rng is None)

    def pump(self, everything: bool) -> None:
        """Handle records: all that wait, or a random few of each log."""
        rng = self.rng
        order = list(range(self.partitions))
        if rng is not None:
            rng.shuffle(order)
        for p in order:
            log = self.logs[p]
            until = len(log) if everything or rng is None else rng.randint(self.read[p], len(log))
            while self.read[p] < until:
                offset = self.read[p]
                self.read[p] += 1
                self.handle(p, offset, *log[offset])
        while (
            self.shares
            and not self.hold_shares
            and (everything or rng is None or rng.random() < 0.7)
        ):
            raw = self.shares.popleft()
            for barrier in self.job_side.on_share(raw):
                self.found.extend(self.engine.on_barrier(list(barrier.shares), barrier.latest_ns))
                self.engine.applied_barrier(barrier.job, barrier.number)

    def handle(self, p: int, offset: int, out: Outgoing, position: int) -> None:
        self.take(p, offset, out, position)
        if self.rng is not None and self.rng.random() < self.restart_chance:
            self.restarts += 1
            self.restart(p)

    def take(self, p: int, offset: int, out: Outgoing, position: int) -> None:
        if not out.mark:
            job = job_of_key(out.key)
            assert job is not None
            assert not self.nodes.on_report(p, offset, out.value, job, position)
            return
        mark = decode_mark(out.value)
        record = self.nodes.on_mark(p, offset, mark)
        if record is None:
            return
        marked = self.marked[(p, mark.job)] = self.marked.get((p, mark.job), -1) + 1
        if marked % self.snapshot_every == 0:  # kept at most so often, as live
            self.saved[(p, mark.job)] = self.nodes.snapshot(p, mark.job)
            self.nodes.saved(p, mark.job)
            self.committed[p] = self.nodes.resume_offset(p, offset + 1)
        raw = encode_share(record)
        self.shares.append(raw)
        if self.rng is not None and self.rng.random() < self.redeliver:
            self.shares.append(raw)
        self.barriers += 1

    def restart(self, p: int) -> None:
        """The worker of partition ``p`` killed: a new one restores every job's snapshot
        and reads again from its last commit."""
        self.nodes.revoke(p)
        for (partition, job), state in self.saved.items():
            if partition == p:
                self.nodes.restore(p, job, state)
        self.read[p] = self.committed[p]

    def run(self, messages: list[C4Model]) -> list[Diagnosis]:
        for message in messages:
            self.feed(message)
        self.pump(everything=True)
        return self.found + self.engine.on_eof()


def _messages(kind: str | None) -> tuple[list[C4Model], object]:
    scenario = suite_case(kind)
    cluster = build_cluster(None, scenario)
    return list(simulate_cluster(cluster, scenario)), cluster.topology


def _named(found: list[Diagnosis]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """What a finding says: its class, state, job and suspects (not its times or scores)."""
    return {
        (d.class_, d.state, d.job or "", tuple(sorted(f"{s.type}:{s.id}" for s in d.suspects)))
        for d in found
    }


@pytest.mark.parametrize("kind", FAULT_TYPES)
def test_every_fault_kind_is_named_as_one_detector_names_it(kind: str) -> None:
    messages, topology = _messages(kind)
    alone = Engine(topology=topology)  # type: ignore[arg-type]
    expected = [d for m in messages for d in alone.on_message(m)] + alone.on_eof()
    assert expected
    first = None
    for partitions in (1, 2, 4):
        split = _Split(Engine(topology=topology), partitions)  # type: ignore[arg-type]
        found = [encode(d) for d in split.run(messages)]
        first = first if first is not None else found
        assert found == first, partitions  # byte for byte, whatever the partitions
        named = _named([Diagnosis.model_validate_json(raw) for raw in found])
        assert {n for n in named if n[1] == "firing"} == {
            n for n in _named(expected) if n[1] == "firing"
        }, partitions


@pytest.mark.parametrize("kind", ["slow_gpu", "link_down", "process_stuck", "node_down"])
def test_interleaved_partitions_shares_twice_and_restarts_name_the_same(kind: str) -> None:
    messages, topology = _messages(kind)
    calm = _named(_Split(Engine(topology=topology), 3).run(messages))  # type: ignore[arg-type]
    for seed, snapshot_every in ((1, 1), (2, 1), (3, 4)):
        rough = _Split(
            Engine(topology=topology),  # type: ignore[arg-type]
            3,
            rng=random.Random(seed),
            redeliver=0.2,
            restart_chance=0.01,
            snapshot_every=snapshot_every,
        )
        named = _named(rough.run(messages))
        firing = {n for n in calm if n[1] == "firing"}
        assert firing <= named, seed
        assert rough.job_side.gate.duplicates > 0
        assert rough.restarts > 0


def test_the_gate_waits_for_every_source_and_lets_barriers_through_in_order() -> None:
    gate = ShareGate(2)
    assert gate.offer("j", 0, 5, None, 10) == []
    assert gate.offer("j", 0, 6, None, 20) == []
    through = gate.offer("j", 1, 6, None, 30)
    assert [(b.number, b.latest_ns) for b in through] == [(5, 10), (6, 30)]
    assert gate.offer("j", 1, 6, None, 30) == []  # again: dropped
    assert gate.duplicates == 1
    with pytest.raises(ValueError, match="sources 0 to 1"):
        gate.offer("j", 2, 7, None, 0)
    restored = ShareGate(1)
    restored.restore("j", 9)
    assert restored.offer("j", 0, 9, None, 0) == []
    assert [b.number for b in restored.offer("j", 0, 10, None, 0)] == [10]


def _by_node(key: bytes) -> int:
    """Partitions by the node a report key names: n0 -> 0, n1 -> 1, ..."""
    node = orjson.loads(key)[1]
    return int(node[1:]) if node else 0


def test_a_job_marks_a_barrier_when_its_reports_enter_a_new_tick() -> None:
    forwarder = Forwarder(tick_ns=100, partitions=3, place=_by_node)
    report = b'{"v":1,"kind":"collective","job":"j","node":"n%d","ts_ns":%d}'
    first = forwarder.forward(report % (1, 150), "j")
    assert [(o.partition, o.mark) for o in first] == [(1, False)]  # nothing before it
    assert forwarder.grown == [("j", (1,))]
    assert len(forwarder.forward(report % (2, 199), "j")) == 1
    assert forwarder.grown[-1] == ("j", (1, 2))
    marked = forwarder.forward(report % (1, 205), "j")
    # Marked into the partitions the job's reports went to, naming them; not into 0.
    assert [(o.partition, o.mark) for o in marked] == [(1, True), (2, True), (1, False)]
    assert decode_mark(marked[0].value) == Mark("barrier", "j", 2, (1, 2))
    assert job_of_key(marked[-1].key) == "j"
    other = forwarder.forward(b'{"kind":"link","node":"x"}', "k")  # not a report: decoded on
    assert [o.partition for o in other] == [0] and job_of_key(other[0].key) == "k"
    assert [o.partition for o in forwarder.to_all(Mark(RUN, "j", 1))] == [0, 1, 2]


def test_a_forwarder_restarted_marks_every_partition_its_job_went_to_before() -> None:
    kept: dict[str, tuple[int, ...]] = {}
    report = b'{"v":1,"kind":"collective","job":"j","node":"n%d","ts_ns":%d}'
    before = Forwarder(tick_ns=100, partitions=4, place=_by_node)
    before.forward(report % (3, 150), "j")
    before.forward(report % (1, 160), "j")
    kept.update(before.grown)
    # The next one reads again from its last commit: only node n1 reports after it. Its
    # barriers still reach partition 3, whose node stage holds the job's state.
    after = Forwarder(tick_ns=100, partitions=4, place=_by_node, recall=lambda j: kept.get(j, ()))
    after.forward(report % (1, 170), "j")
    marked = after.forward(report % (1, 250), "j")
    assert [o.partition for o in marked if o.mark] == [1, 3]
    assert decode_mark(marked[0].value).sources == (1, 3)
    assert after.grown == []  # nothing new to keep
    after.forget("j")
    assert after.holders_of("j") == set()  # a stopped job starts again, not recalled
    after.drop(["j"])
    assert after.holders_of("j") == {1, 3}  # its partition came back: recalled again


def test_the_gate_waits_only_for_the_sources_a_barrier_was_marked_into() -> None:
    gate = ShareGate(4)
    assert gate.offer("small", 2, 5, None, 10, (0, 2)) == []
    assert [b.number for b in gate.offer("small", 0, 5, None, 20, (0, 2))] == [5]
    # A source that joins later is waited for from the barrier that names it on.
    assert gate.offer("small", 0, 6, None, 30, (0, 2, 3)) == []
    assert gate.offer("small", 2, 6, None, 30, (0, 2, 3)) == []
    assert [b.number for b in gate.offer("small", 3, 6, None, 40, (0, 2, 3))] == [6]
    # Barriers go through in order: 8 waits for 7 although all of 8's sources passed it.
    assert gate.offer("small", 0, 7, None, 0, (0, 2, 3)) == []
    assert gate.offer("small", 2, 7, None, 0, (0, 2, 3)) == []
    assert gate.offer("small", 2, 8, None, 0, (2,)) == []
    assert [b.number for b in gate.offer("small", 3, 8, None, 0, (2, 3))] == [7, 8]
    with pytest.raises(ValueError, match="marked into"):
        gate.offer("small", 0, 9, None, 0, (0, 4))


def test_a_node_stage_rejects_what_its_text_misnamed_and_what_does_not_decode() -> None:
    nodes = NodeSide()
    bad = nodes.on_report(0, 0, b'{"v":1,"kind":"collective"', "j", 1)
    assert len(bad) == 1 and bad[0].rejection.code.value == "invalid_json"
    messages, _ = _messages("slow_gpu")
    report = next(m for m in messages if isinstance(m, Collective | Collectives))
    misnamed = nodes.on_report(0, 1, encode(report), "other-job", 2)
    assert [r.rejection.code.value for r in misnamed] == ["inconsistent"]
    assert nodes.on_report(0, 2, encode(report), report.job, 3) == []


def test_records_of_the_stages_that_are_not_theirs_are_wire_errors() -> None:
    bad_marks = (
        b"",
        b"{}",
        b"[]",
        b'{"v":1,"mark":"explode","job":"j","n":1}',
        b'{"v":2}',
        b'{"v":1,"mark":"barrier","job":"j","n":1,"s":[-1]}',
        b'{"v":1,"mark":"barrier","job":"j","n":1,"s":"0"}',
    )
    for raw in bad_marks:
        with pytest.raises(WireError):
            decode_mark(raw)
    empty = encode_share(ShareRecord("j", 0, 1, 0, None))
    for raw in (b"", b"x", b"\x78not zlib", empty[:-3], zlib.compress(empty[:-3])):
        with pytest.raises(WireError):
            decode_share(raw)
    # A share whose rows are not of their types never reaches the job stage, in either
    # format (MessagePack; compressed JSON, the first one).
    job, share, latest = _one_share()
    document = msgspec.msgpack.decode(encode_share(ShareRecord(job, 0, 1, latest, share)))
    for encoded in (msgspec.msgpack.encode, lambda d: zlib.compress(orjson.dumps(d))):
        for field_name, bad in (("times", ["x"]), ("seen", [[1, 2]]), ("parts", [["c", 1]])):
            broken = {**document, "share": {**document["share"], field_name: bad}}
            with pytest.raises(WireError, match="not a share record"):
                decode_share(encoded(broken))
        with pytest.raises(WireError, match="version 2"):
            decode_share(encoded({**document, "v": 2}))
    side = JobSide(2)
    with pytest.raises(WireError, match="source 5"):
        side.on_share(encode_share(ShareRecord("j", 5, 1, 0, None)))
    # A barrier said to be marked into a partition the gate does not have is a wire
    # error (a dead letter), not an exception that stops the job stage's agent.
    with pytest.raises(WireError, match="marked into"):
        side.on_share(encode_share(ShareRecord("j", 1, 1, 0, None, (0, 7))))


def _one_share() -> tuple[str, JobShare, int]:
    """A simulated run's reports taken by one node stage, handed on at one barrier."""
    messages, _ = _messages("slow_gpu")
    stage = NodeStage()
    for position, message in enumerate(messages):
        if isinstance(message, Collective | Collectives):
            stage.on_message(message, position)
    job = stage.jobs()[0]
    share, latest = stage.barrier_of(job)
    assert share is not None
    return job, share, latest


def test_a_share_crosses_the_wire_unchanged() -> None:
    job, share, latest = _one_share()
    record = decode_share(encode_share(ShareRecord(job, 1, 7, latest, share)))
    assert record == ShareRecord(job, 1, 7, latest, share)
    marked = ShareRecord(job, 1, 7, latest, share, (1, 3))
    assert decode_share(encode_share(marked)) == marked
    # A record of the first format (compressed JSON, no sources) still reads the same.
    document = msgspec.msgpack.decode(encode_share(ShareRecord(job, 1, 7, latest, share)))
    assert decode_share(zlib.compress(orjson.dumps(document), 1)) == record


def test_a_silent_job_gets_a_barrier_of_its_own_so_nothing_waits_at_the_node_stages() -> None:
    forwarder = Forwarder(tick_ns=100, partitions=2, place=_by_node)
    report = b'{"v":1,"kind":"collective","job":"j","node":"n%d","ts_ns":%d}'
    forwarder.forward(report % (0, 150), "j", now_s=10.0)
    forwarder.forward(report % (1, 160), "j", now_s=10.2)
    assert forwarder.silent(10.6, after_s=0.5) == []  # 0.4 s: not silent yet
    marks = forwarder.silent(10.7, after_s=0.5)
    assert [(o.partition, decode_mark(o.value).number) for o in marks] == [(0, 2), (1, 2)]
    report = b'{"v":1,"kind":"collective","job":"j","node":"n1","ts_ns":%d}'
    assert forwarder.silent(20.0, after_s=0.5) == []  # once per silence
    assert len(forwarder.forward(report % 170, "j", now_s=21.0)) == 1  # tick 1: before 2
    assert len(forwarder.forward(report % 250, "j", now_s=21.1)) == 1  # tick 2: marked
    marked = forwarder.forward(report % 301, "j", now_s=21.2)
    assert [decode_mark(o.value).number for o in marked[:2]] == [3, 3]
    forwarder.forget("j")
    assert forwarder.silent(99.0, after_s=0.5) == []


@pytest.mark.parametrize("kind", ["slow_gpu", "port_degraded"])
def test_a_job_stage_restored_from_its_snapshot_drops_the_shares_it_took(kind: str) -> None:
    messages, topology = _messages(kind)
    calm = _Split(Engine(topology=topology), 2)  # type: ignore[arg-type]
    expected = {n for n in _named(calm.run(messages)) if n[1] == "firing"}
    split = _Split(Engine(topology=topology), 2, hold_shares=True)  # type: ignore[arg-type]
    taken: list[bytes] = []  # every share record the job stage read, in order

    def offer(raw: bytes) -> None:
        taken.append(raw)
        for barrier in split.job_side.on_share(raw):
            split.found.extend(split.engine.on_barrier(list(barrier.shares), barrier.latest_ns))
            split.engine.applied_barrier(barrier.job, barrier.number)

    half = len(messages) // 2
    for message in messages[:half]:
        split.feed(message)
        while split.shares:
            offer(split.shares.popleft())
    # The job stage's worker dies: a new one restores every key's snapshot, the gate
    # learns which barrier each job's state holds, and the shares since the last commit
    # (the last 20) come again.
    old = split.engine
    keys = old.keys("job") + old.keys("node")
    states = old.snapshot(keys)
    assert any(old.applied_barrier(key.id) is not None for key in keys if key.kind == "job")
    split.engine = Engine(topology=topology)  # type: ignore[arg-type]
    for key, state in states.items():
        split.engine.restore(key, state)
    split.job_side = JobSide(2)
    for key in keys:
        applied = split.engine.applied_barrier(key.id) if key.kind == "job" else None
        if applied is not None:
            split.job_side.gate.restore(key.id, applied)
    for raw in taken[-20:]:
        offer(raw)
    assert split.job_side.gate.duplicates > 0
    for message in messages[half:]:
        split.feed(message)
        while split.shares:
            offer(split.shares.popleft())
    found = split.found + split.engine.on_eof()
    assert {n for n in _named(found) if n[1] == "firing"} == expected

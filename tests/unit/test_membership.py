"""Placements from the ranks' own reports, and the finding for ranks that never joined."""

from __future__ import annotations

import orjson

from schemas.base import C4Model
from schemas.codec import decode
from schemas.messages import Collective, Diagnosis, Job, Member
from schemas.records import Rejected, decode_record
from streams.core.engine import Engine
from streams.core.membership import MembershipBook
from tests.contract import contract_examples
from tests.unit.ring_job import T0 as RING_T0
from tests.unit.ring_job import RingJob

S = 1_000_000_000
T0 = 1_800_000_000 * S
NODES = ("node-000", "node-001", "node-002", "node-003")


def member(rank: int, world: int = 8, restart: int = 0, ts: int = T0, **extra: object) -> Member:
    per_node = world // len(NODES) or 1
    fields: dict[str, object] = {
        "v": 1,
        "kind": "member",
        "job": "4242",
        "ts_ns": ts,
        "rank": rank,
        "world_size": world,
        "node": NODES[min(rank // per_node, len(NODES) - 1)],
        "local_rank": rank % per_node,
        "gpu": rank % per_node,
        "restart": restart,
        "job_nodes": list(NODES),
    }
    return Member.model_validate(fields | extra)


def test_the_placement_is_published_once_every_rank_has_reported() -> None:
    book = MembershipBook()
    for rank in range(7):
        assert book.ingest(member(rank, ts=T0 + rank)) == []
    (job,) = book.ingest(member(7, ts=T0 + 7))
    assert isinstance(job, Job)
    assert job.state == "running" and job.ts_ns == T0 + 7 and job.comms == {}
    assert [(p.rank, p.node, p.gpu) for p in job.ranks][:3] == [
        (0, "node-000", 0),
        (1, "node-000", 1),
        (2, "node-001", 0),
    ]
    assert book.ingest(member(3, ts=T0 + 9)) == []  # the same place again: nothing new
    moved = book.ingest(member(3, ts=T0 + 10, gpu=5))
    assert isinstance(moved[0], Job) and moved[0].ranks[3].gpu == 5


def test_a_restart_starts_the_next_placement_and_stale_reports_are_ignored() -> None:
    book = MembershipBook()
    for rank in range(8):
        book.ingest(member(rank))
    assert book.ingest(member(0, restart=1, node="node-004")) == []
    assert book.placement("4242") is None  # the first run's placement is over
    assert book.ingest(member(5, restart=0)) == []  # a late report of the first run
    for rank in range(1, 7):
        assert book.ingest(member(rank, restart=1)) == []
    (job,) = book.ingest(member(7, restart=1))
    assert isinstance(job, Job) and job.ranks[0].node == "node-004"


def test_ranks_that_never_joined_are_named_with_the_nodes_they_were_meant_for() -> None:
    book = MembershipBook(join_bound_ns=60 * S)
    for rank in (0, 1, 2, 3, 6, 7):  # node-002's two ranks never come up
        book.ingest(member(rank))
    assert book.check(T0 + 59 * S) == []
    (fired,) = book.check(T0 + 60 * S)
    assert isinstance(fired, Diagnosis)
    assert fired.class_ == "ranks_missing" and fired.state == "firing"
    assert [(s.type, s.id, s.score) for s in fired.suspects] == [
        ("rank", "4242/rank4", 1.0),
        ("rank", "4242/rank5", 1.0),
        ("node", "node-002", 1.0),
    ]
    assert fired.evidence == {"world_size": 8, "reported": 6, "missing": 2, "restart": 0}
    assert book.check(T0 + 90 * S) == []  # fired once
    book.ingest(member(4, ts=T0 + 100 * S))
    job, resolved = book.ingest(member(5, ts=T0 + 101 * S))
    assert isinstance(job, Job)
    assert isinstance(resolved, Diagnosis) and resolved.state == "resolved"
    assert resolved.id == fired.id


def test_a_world_that_does_not_divide_names_the_nodes_with_no_rank() -> None:
    book = MembershipBook(join_bound_ns=S)
    for rank in range(4):
        book.ingest(member(rank, world=7, node=NODES[rank // 2]))
    (fired,) = book.check(T0 + S)
    assert isinstance(fired, Diagnosis)
    nodes = [(s.id, s.score) for s in fired.suspects if s.type == "node"]
    assert nodes == [("node-002", 0.5), ("node-003", 0.5)]


def test_a_restart_resolves_the_finding_of_the_run_before() -> None:
    book = MembershipBook(join_bound_ns=S)
    book.ingest(member(0))
    (fired,) = book.check(T0 + S)
    (resolved,) = book.ingest(member(0, restart=1, ts=T0 + 2 * S))
    assert isinstance(fired, Diagnosis) and isinstance(resolved, Diagnosis)
    assert resolved.id == fired.id and resolved.state == "resolved"


def test_the_state_survives_a_snapshot() -> None:
    book = MembershipBook(join_bound_ns=S)
    for rank in range(7):
        book.ingest(member(rank))
    book.check(T0 + S)
    restored = MembershipBook(join_bound_ns=S)
    saved = book.job_state("4242")
    assert saved is not None and book.job_state("other") is None
    restored.restore_job("4242", orjson.loads(orjson.dumps(saved)))
    assert restored.check(T0 + 5 * S) == []  # already fired before the snapshot
    job, resolved = restored.ingest(member(7, ts=T0 + 6 * S))
    assert isinstance(job, Job) and len(job.ranks) == 8
    assert isinstance(resolved, Diagnosis) and resolved.state == "resolved"


def test_member_reports_travel_on_the_job_topic_and_are_checked() -> None:
    example = contract_examples()["member"]
    (taken,) = decode_record(orjson.dumps(example), "job")
    assert isinstance(taken, Member) and taken.place().port == "mlx5_1:1"
    (wrong,) = decode_record(orjson.dumps(example | {"rank": 8}), "job")
    assert isinstance(wrong, Rejected) and wrong.reason == "rank: 8 >= world_size 8"
    (twice,) = decode_record(orjson.dumps(example | {"job_nodes": ["a", "b", "a"]}), "job")
    assert isinstance(twice, Rejected) and twice.reason == "job_nodes[2]: 'a' listed twice"
    (elsewhere,) = decode_record(orjson.dumps(example), "collective")
    assert isinstance(elsewhere, Rejected) and elsewhere.reason.startswith("kind: expected")
    assert not isinstance(decode(orjson.dumps(example | {"restart": -1})), Member)


def ring_members(job: RingJob, ranks: range) -> list[Member]:
    return [
        Member(
            v=1,
            kind="member",
            job=job.job,
            ts_ns=RING_T0 + rank,
            rank=rank,
            world_size=job.n,
            node=job.place(rank)[0],
            gpu=job.place(rank)[1],
            port=job.place(rank)[2],
        )
        for rank in ranks
    ]


def engine_findings(messages: list[C4Model]) -> tuple[list[Diagnosis], Engine]:
    engine = Engine()
    found = [d for message in messages for d in engine.process(message)]
    return found + engine.advance(engine.now_ns + 120 * S), engine


def test_the_engine_names_the_gpu_from_the_ranks_reports_alone() -> None:
    job = RingJob(stuck_rank={11: 40})
    # Collective messages that say nothing of where they run (node, GPU): only the ranks'
    # own reports place them.
    bare = [m.model_copy(update={"node": None, "gpu": None}) for m in job.messages()]
    unplaced, _ = engine_findings(list(bare))
    assert [d.suspects[0].id for d in unplaced] == ["job-1/rank11"]
    placed, engine = engine_findings([*ring_members(job, range(16)), *bare])
    assert [(d.class_, d.suspects[0].id) for d in placed] == [("noncomm_hang", "node-001/gpu3")]
    (assembled,) = engine.drain_placements()
    assert assembled.job == "job-1" and len(assembled.ranks) == 16
    assert engine.drain_placements() == []


def test_the_engine_fires_ranks_missing_and_keeps_it_in_the_job_snapshot() -> None:
    job = RingJob()
    found, engine = engine_findings([*ring_members(job, range(14)), *job.messages()])
    missing = [d for d in found if d.class_ == "ranks_missing"]
    assert [s.id for s in missing[0].suspects] == ["job-1/rank14", "job-1/rank15"]
    state = engine.job_state("job-1")
    assert state is not None and "membership" in state
    restored = Engine()
    restored.restore_job("job-1", orjson.loads(orjson.dumps(state)))
    (late,) = ring_members(job, range(14, 15))
    assert restored.process(late) == []
    (last,) = ring_members(job, range(15, 16))
    (resolved,) = restored.process(last)
    assert resolved.id == missing[0].id and resolved.state == "resolved"
    assert len(restored.drain_placements()) == 1


def shifted(message: Collective, by_ns: int) -> Collective:
    ops = message.ops.model_copy(
        update={
            "enter_ns": tuple(t + by_ns for t in message.ops.enter_ns),
            "end_ns": tuple(None if t is None else t + by_ns for t in message.ops.end_ns),
        }
    )
    return message.model_copy(update={"ts_ns": message.ts_ns + by_ns, "ops": ops})


def test_a_restart_forgets_the_run_before_and_its_messages_in_flight() -> None:
    # Run 0 hangs (rank 5 stops entering); the job is requeued; run 1, on the same ranks
    # and communicator ids, counting its operations from the start again, is healthy.
    first, second = RingJob(stuck_rank={5: 40}), RingJob(seed=2)
    cut = RING_T0 + 40 * S
    run0 = [m for m in first.messages() if m.ts_ns < cut]
    late = run0[-3:]  # the last reports of run 0, delivered only after the restart
    restart = [
        m.model_copy(update={"restart": 1, "ts_ns": cut + S})
        for m in ring_members(first, range(16))
    ]
    run1 = [shifted(m, cut + 2 * S - RING_T0) for m in second.messages()]
    before, engine = engine_findings([*ring_members(first, range(16)), *run0])
    assert [(d.class_, d.state) for d in before] == [("noncomm_hang", "firing")]
    old = engine.jobs["job-1"]
    # The first report of the new run closes what the old run's detectors held; the new
    # run's placement starts a detector afresh.
    at_restart = [d for m in restart for d in engine.process(m)]
    assert [(d.class_, d.state) for d in at_restart] == [("noncomm_hang", "resolved")]
    assert engine.jobs["job-1"] is not old and not engine.jobs["job-1"].comms
    # The old run's reports still in flight are no evidence about the new one.
    assert [d for m in late for d in engine.process(m)] == []
    assert not engine.jobs["job-1"].comms
    after = [d for m in run1 for d in engine.process(m)]
    assert after + engine.advance(engine.now_ns + 120 * S) == []
    assert len(engine.drain_placements()) == 2  # one placement per run


def test_a_first_runs_reports_from_before_its_first_member_report_are_kept() -> None:
    # Node clocks differ a little: a rank's first collective may be stamped before the
    # first member report; only a restart makes older reports stale.
    job = RingJob()
    members = [
        m.model_copy(update={"ts_ns": RING_T0 + 5 * S}) for m in ring_members(job, range(16))
    ]
    early = [m for m in job.messages() if m.ts_ns < RING_T0 + 5 * S]
    assert early
    _, engine = engine_findings([*members, *early])
    assert engine.jobs["job-1"].comms  # taken, not dropped as a replaced run's


def test_ranks_in_pods_give_a_placement_that_names_each_ranks_pod() -> None:
    book = MembershipBook()
    published: list[object] = []
    for rank in range(8):
        published += book.ingest(member(rank, pod=f"train/llm-worker-{rank}"))
    (job,) = published
    assert isinstance(job, Job)
    assert [place.pod for place in job.ranks] == [f"train/llm-worker-{r}" for r in range(8)]
    # On the wire as the contract says, and read back by a consumer unchanged.
    assert decode(job.model_dump_json(by_alias=True).encode(), "job") == job

"""Placements from the ranks' own reports, and the finding for ranks that never joined."""

from __future__ import annotations

import orjson

from schemas.codec import decode
from schemas.messages import Diagnosis, Job, Member
from schemas.records import Rejected, decode_record
from streams.core.membership import MembershipBook
from tests.contract import contract_examples

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
    restored.restore(orjson.loads(orjson.dumps(book.state())))
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

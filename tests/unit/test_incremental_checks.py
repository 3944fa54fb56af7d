"""What a check reads is kept as the reports come (issue 34): the same answers as a full
read of every member, at a cost in what changed since the last check, not in the group."""

from __future__ import annotations

import random

from schemas.messages import Collective, Conns, Ops, RankPlace
from streams.core.comm import CONN_LOG_KEPT, CommTracker
from streams.core.compute import ComputeTracker
from streams.core.engine import RouteBook
from streams.core.findings import FindingBook
from streams.core.groups import JobGroups
from streams.core.nodes import NodeWatch
from streams.core.params import DetectorParams
from streams.core.throughput import ConnThroughputs

PARAMS = DetectorParams()
SIZE = 16


def report(
    rank: int,
    ts_ns: int,
    rng: random.Random,
    *,
    node: str | None = None,
    peers: tuple[int, ...] = (),
    comm: str = "c",
) -> Collective:
    """One rank's report with no operation; connection samples to ``peers`` if any."""
    conns = None
    if peers:
        conns = Conns(
            peer=peers,
            port=("mlx5_0:1",) * len(peers),
            bytes=tuple(rng.randrange(1, 1 << 20) for _ in peers),
            busy_ns=tuple(rng.choice((0, rng.randrange(1, 1 << 16))) for _ in peers),
        )
    return Collective(
        v=1,
        kind="collective",
        job="j",
        comm=comm,
        comm_size=SIZE,
        rank=rank,
        global_rank=rank,
        node=node,
        ts_ns=ts_ns,
        ops=Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=()),
        conns=conns,
    )


def ring_peers(rank: int, rng: random.Random) -> tuple[int, ...]:
    """A ring's two neighbours, now and then a third peer (a connection set that moves)."""
    peers = [(rank + 1) % SIZE, (rank - 1) % SIZE]
    if rng.random() < 0.05:
        peers.append((rank + 2) % SIZE)
    return tuple(dict.fromkeys(peers))


def test_ranks_since_a_version_are_those_that_reported_connections_then() -> None:
    rng = random.Random(1)
    tracker = CommTracker("j", "c", SIZE, PARAMS)
    tracker.ingest(report(3, 1, rng, peers=(4,)))
    version = tracker.conn_version
    tracker.ingest(report(5, 2, rng, peers=(6,)))
    tracker.ingest(report(7, 3, rng))  # no connections: not a connection report
    tracker.ingest(report(5, 4, rng, peers=(6,)))
    assert tracker.conn_ranks_since(version) == {5}
    assert tracker.conn_ranks_since(tracker.conn_version) == set()
    last: list[int] = []
    for ts in range(5, 5 + 3 * CONN_LOG_KEPT):
        rank = ts % SIZE
        tracker.ingest(report(rank, ts, rng, peers=((rank + 1) % SIZE,)))
        last = [*last[-1:], rank]
    assert tracker.conn_ranks_since(version) is None  # further back than it keeps
    assert tracker.conn_ranks_since(tracker.conn_version - 2) == set(last)


def test_throughputs_and_falls_kept_as_reports_come_equal_a_full_read() -> None:
    seen_fell = False
    for seed in range(6):
        rng = random.Random(seed)
        tracker = CommTracker("j", "c", SIZE, PARAMS)
        routes = RouteBook()
        kept = ConnThroughputs("j", PARAMS, routes)
        full = ConnThroughputs("j", PARAMS, routes)
        for step in range(400):
            for _ in range(rng.randrange(0, 6)):
                rank = rng.randrange(SIZE)
                tracker.ingest(report(rank, step * 10 + rank, rng, peers=ring_peers(rank, rng)))
            if rng.random() < 0.3:
                continue  # no check this tick
            kept.new_check()
            full.clear()  # every cache dropped: the full read, references kept
            full.new_check()
            now = kept.of(tracker)
            expected_now = full.of(tracker)
            assert list(now.items()) == list(expected_now.items())
            assert kept.of(tracker, history=True) == full.of(tracker, history=True)
            fell = kept.fell(tracker, now)
            assert fell == full.fell(tracker, expected_now)
            seen_fell = seen_fell or bool(fell)
            assert list(kept.state().items()) == list(full.state().items())
    assert seen_fell  # connections did fall: the kept answers were not all empty


def test_last_seen_per_node_equals_the_members_own() -> None:
    rng = random.Random(7)
    groups = JobGroups("j")
    tracker = groups.comms["c"] = CommTracker("j", "c", SIZE, PARAMS)
    # Ranks 12-15 never name their node: the job's placement does.
    groups.placement = {
        rank: RankPlace(rank=rank, node=f"placed-{rank // 2}", gpu=0) for rank in range(SIZE)
    }
    watch = NodeWatch(groups, PARAMS, FindingBook())
    for ts in range(1, 600):
        rank = rng.randrange(SIZE)
        node = None if rank >= 12 else f"node-{rank // 4}"
        if rank == 3 and ts > 300:
            node = "node-moved"  # a member that reports another node from now on
        tracker.ingest(report(rank, ts, rng, node=node))
        expected: dict[str, int] = {}
        for member in tracker.members:
            where, _, _ = groups.place(member)
            if where is not None and member.last_seen_ns >= 0:
                at = max(member.last_seen_ns, tracker.finished_ns)
                expected[where] = max(expected.get(where, -1), at)
        assert watch.last_seen() == expected
        assert groups.latest_seen_ns() == max(m.last_seen_ns for m in tracker.members)


def test_slow_ranks_follow_the_windows_judged() -> None:
    compute = ComputeTracker(slice_ns=100)
    members = (0, 1, 2)
    found = []
    for k in range(1, 9):
        for rank in members:
            busy = 40 if rank == 2 else 70  # rank 2 computes 60 of each 100, the others 30
            end = k * 100
            compute.add(rank, "c", end, (k,), ("allreduce",), (1,), (end - busy,), (end,))
        compute.sync("c", members, [k * 100] * 3)
        compute.judge()
        found.append([slow.global_rank for slow in compute.slow_ranks(3, 3, 1.5)])
        assert compute.slow_ranks(3, 3, 1.5) == compute._slow_ranks(3, 3, 1.5)
    # Windows from the second sync point on; three judged by the fourth.
    assert found == [[], [], [], [2], [2], [2], [2], [2]]


def test_a_compute_snapshot_holds_what_windows_still_read_and_goes_on_alike() -> None:
    members = (0, 1, 2)

    def feed(compute: ComputeTracker, windows: range) -> None:
        for k in windows:
            for rank in members:
                busy = 40 if rank == 2 else 70
                end = k * 100
                compute.add(rank, "c", end, (k,), ("allreduce",), (1,), (end - busy,), (end,))
            if k % 3:  # some windows wait for a report past their end
                compute.sync("c", members, [k * 100] * 3)
            compute.judge()

    going = ComputeTracker(slice_ns=100)
    feed(going, range(1, 40))
    state = going.state()
    kept = sum(len(ops) for _, ops, *_ in state["ranks"])
    assert 0 < kept < sum(len(rank.ops) for rank in going.ranks.values())
    restored = ComputeTracker.restored(state)
    feed(going, range(40, 80))
    feed(restored, range(40, 80))
    assert restored.verdicts == going.verdicts
    assert [slow.global_rank for slow in going.slow_ranks(3, 3, 1.5)] == [2]  # not vacuous
    assert restored.slow_ranks(3, 3, 1.5) == going.slow_ranks(3, 3, 1.5)


def test_a_snapshot_has_the_placement_in_force() -> None:
    from schemas.messages import Job
    from streams.core.job import JobDetector

    detector = JobDetector("j", PARAMS, _NoPorts(), RouteBook())

    def placed(node: str) -> Job:
        places = tuple(RankPlace(rank=r, node=node, gpu=r) for r in range(4))
        return Job(v=1, kind="job", job="j", ts_ns=1, state="running", ranks=places, comms={})

    detector.on_job(placed("node-a"))
    assert {p["node"] for p in detector.state()["placement"]} == {"node-a"}
    assert detector.state()["placement"] is detector.state()["placement"]  # dumped once
    detector.on_job(placed("node-b"))  # the job moved: its new placement is the one kept
    assert {p["node"] for p in detector.state()["placement"]} == {"node-b"}


class _NoPorts:
    """Port health with every port up and quiet."""

    def is_down(self, port: str) -> bool:
        return False

    def errors_rising(self, port: str) -> bool:
        return False

    def health_version(self) -> int:
        return 0

"""Durable detection with plain dicts as its tables: restart, redelivery, revocation."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from schemas.base import C4Model
from schemas.messages import Diagnosis, Job, Link, RankPlace, Route, RoutePath
from simulator import scenario_from, simulate
from streams.core.engine import Engine, RouteBook, _SharedRoutes
from streams.core.stage import JOB, NODE, StateKey
from streams.durable import SnapshotStore
from streams.live import LiveDetection
from streams.shared import TableFacts

S = 1_000_000_000
SCENARIO = {
    "seed": 3,
    "duration_s": 32,
    "jobs": [
        {"id": "job-1", "ranks": 32, "compute_ms": 150},
        {"id": "job-2", "ranks": 16, "compute_ms": 100},
    ],
    "faults": [
        {"type": "slow_gpu", "job": "job-1", "rank": 5, "factor": 1.3, "at_s": 4},
        {"type": "port_degraded", "node": "node-004", "port": "mlx5_2:1", "factor": 0.5, "at_s": 6},
        {"type": "gpu_stop", "job": "job-2", "rank": 3, "at_s": 20},
    ],
}


class FakeClock:
    """Wall time that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _messages() -> list[C4Model]:
    return list(simulate(None, scenario_from(SCENARIO)))


def _ts(message: C4Model) -> int:
    return int(getattr(message, "ts_ns", 0))


@dataclass(frozen=True, slots=True)
class Worker:
    """A live worker's detection: the stage, its runtime and the runtime's snapshot store."""

    stage: Engine
    live: LiveDetection
    store: SnapshotStore


def _worker(jobs: dict[bytes, bytes], nodes: dict[bytes, bytes], clock: FakeClock) -> Worker:
    engine = Engine()
    store = SnapshotStore(
        {JOB: jobs, NODE: nodes}, lambda key: True, snapshot_interval_s=1.0, monotonic=clock
    )
    return Worker(engine, LiveDetection(engine, monotonic=clock, store=store), store)


def _feed(worker: Worker, messages: list[C4Model], clock: FakeClock) -> Iterator[Diagnosis]:
    for message in messages:
        clock.now += 0.01
        yield from worker.live.on_message(message)
        yield from worker.live.on_timer()


def test_a_restarted_worker_goes_on_from_its_tables() -> None:
    messages = _messages()
    engine = Engine()
    expected = [d for m in messages for d in engine.process(m)]
    firing = {(d.id, d.class_) for d in expected if d.state == "firing"}
    assert {cls for _, cls in firing} >= {"noncomm_slow", "link_degraded", "noncomm_hang"}

    jobs: dict[bytes, bytes] = {}
    nodes: dict[bytes, bytes] = {}
    start = _ts(messages[0])
    killed_at = next(i for i, m in enumerate(messages) if _ts(m) > start + 15 * S)
    committed = next(i for i, m in enumerate(messages) if _ts(m) > start + 13 * S)
    clock = FakeClock()
    first = _worker(jobs, nodes, clock)
    published = list(_feed(first, messages[:killed_at], clock))
    assert {d.class_ for d in published} >= {"noncomm_slow", "link_degraded"}
    assert set(jobs) == {b"job-1", b"job-2"} and nodes

    # kill -9: the worker's memory is gone, its tables (changelog) and committed offset stay;
    # everything after the committed offset is delivered again.
    second = _worker(jobs, nodes, clock)
    second.store.adopt_owned(second.stage)
    assert second.store.counters.restored == len(jobs) + len(nodes)
    published += _feed(second, messages[committed:], clock)

    keys = [(d.id, d.state) for d in published]
    assert len(keys) == len(set(keys)), "a finding was published twice"
    assert {(d.id, d.class_) for d in published if d.state == "firing"} == firing


def test_a_restored_hang_is_not_ended_by_the_records_from_before_it_fired() -> None:
    # Killed once the hang of job-2 (a GPU stopped at 20 s) was published and saved, with
    # the committed offset before the hang began: the records delivered again show the
    # operation pending but not hung yet. They must not resolve the restored finding (it
    # would then fire again under its own id: published twice; the chaos test saw it).
    messages = _messages()
    engine = Engine()
    expected = [d for m in messages for d in engine.process(m)]
    hang = next(d for d in expected if d.class_ == "noncomm_hang" and d.state == "firing")
    jobs: dict[bytes, bytes] = {}
    nodes: dict[bytes, bytes] = {}
    killed_at = next(i for i, m in enumerate(messages) if _ts(m) > hang.ts_ns + 2 * S)
    committed = next(i for i, m in enumerate(messages) if _ts(m) > hang.onset_ns - 2 * S)
    clock = FakeClock()
    published = list(_feed(_worker(jobs, nodes, clock), messages[:killed_at], clock))
    assert (hang.id, "firing") in {(d.id, d.state) for d in published}
    second = _worker(jobs, nodes, clock)
    second.store.adopt_owned(second.stage)
    published += _feed(second, messages[committed:], clock)
    keys = [(d.id, d.state) for d in published]
    assert len(keys) == len(set(keys)), "a finding was published twice"
    assert [d.state for d in published if d.id == hang.id] == [
        d.state for d in expected if d.id == hang.id
    ]


def test_a_fresh_worker_without_tables_relearns_and_publishes_again() -> None:
    # The contrast that shows the tables matter: without them the restarted worker fires
    # the open findings a second time.
    messages = _messages()
    start = _ts(messages[0])
    killed_at = next(i for i, m in enumerate(messages) if _ts(m) > start + 15 * S)
    clock = FakeClock()
    published = list(_feed(_worker({}, {}, clock), messages[:killed_at], clock))
    published += _feed(_worker({}, {}, clock), messages[killed_at:], clock)
    stragglers = {d.id for d in published if d.class_ == "noncomm_slow" and d.state == "firing"}
    assert len(stragglers) == 2  # the same straggler, named again under a new onset


def test_an_unreadable_snapshot_is_relearnt_not_trusted() -> None:
    messages = _messages()
    clock = FakeClock()
    jobs = {b"job-1": b"garbage", b"job-2": b"\x78\x9c broken"}
    worker = _worker(jobs, {}, clock)
    list(_feed(worker, messages[:200], clock))
    assert worker.store.counters.unreadable == 2
    assert set(worker.stage.jobs) == {"job-1", "job-2"}  # relearning from the messages


def test_revoked_jobs_are_dropped_and_saved_first() -> None:
    messages = _messages()
    clock = FakeClock()
    jobs: dict[bytes, bytes] = {}
    worker = _worker(jobs, {}, clock)
    list(_feed(worker, messages[:300], clock))
    before = dict(jobs)
    worker.live.on_revoked([StateKey(JOB, "job-1")])
    assert "job-1" not in worker.stage.jobs
    assert jobs[b"job-1"] != b"" and b"job-1" in before


def test_table_facts_answer_what_other_partitions_learnt() -> None:
    messages = _messages()
    table: dict[bytes, bytes] = {}
    facts = TableFacts(table)
    writer = Engine()
    for message in messages:
        writer.process(message)
        facts.learn(message, writer)
    assert facts.job_of_gpu("node-000/gpu0") == "job-1"
    assert facts.job_of_port("node-004/mlx5_0:1") == "job-2"
    assert facts.port_health("node-004/mlx5_2:1") == (False, True)
    assert facts.port_health("node-000/mlx5_0:1") == (False, False)
    # A worker that saw only the link messages (its partitions) attributes the port's
    # finding to the job placed there, from the facts another worker learnt.
    reader = Engine(shared=facts)
    found = [d for m in messages if isinstance(m, Link) for d in reader.process(m)]
    assert [(d.class_, d.job) for d in found] == [("link_degraded", "job-2")]
    alone = Engine()
    found = [d for m in messages if isinstance(m, Link) for d in alone.process(m)]
    assert [(d.class_, d.job) for d in found] == [("link_degraded", None)]


def test_table_facts_say_when_a_plan_moved_a_flow() -> None:
    table: dict[bytes, bytes] = {}
    facts = TableFacts(table)
    writer = Engine()
    flow = "job-1/c/7->8"

    def route(plan: str, via: str | None, ts_ns: int) -> Route:
        paths = (RoutePath(flow=flow, port="mlx5_7:1", via=via),)
        return Route(v=1, kind="route", node="node-000", ts_ns=ts_ns, plan=plan, paths=paths)

    for message in _messages()[:200]:
        writer.process(message)
    first = route("p-1", None, writer.now_ns)
    writer.process(first)
    facts.learn(first, writer)
    assert (facts.via(flow), facts.moved_at(flow)) == (None, None)  # planned, never moved
    moved = route("p-2", "spine-a-0", writer.now_ns)
    writer.process(moved)
    facts.learn(moved, writer)
    assert (facts.via(flow), facts.moved_at(flow)) == ("spine-a-0", writer.now_ns)
    assert writer.routes.moved_at(flow) == writer.now_ns
    for message in _messages()[200:400]:
        writer.process(message)
    again = route("p-3", "spine-a-0", writer.now_ns)
    facts.learn(again, writer)  # the same spine in a newer plan: not moved again
    assert facts.moved_at(flow) == writer.routes.moved_at(flow) < writer.now_ns


def test_the_shared_tokens_change_with_moves_and_port_health_only() -> None:
    """A reader's caches hold while the tokens stand; any worker's change renews them."""
    messages = _messages()
    table: dict[bytes, bytes] = {}
    facts = TableFacts(table)
    writer = Engine()
    flow = "job-1/c/7->8"
    health_tokens, routes_tokens = [facts.health_token()], [facts.routes_token()]
    changes = 0
    for message in messages:
        writer.process(message)
        before = {k: v for k, v in table.items() if k.startswith(b"health:")}
        facts.learn(message, writer)
        after = {k: v for k, v in table.items() if k.startswith(b"health:")}
        changes += before != after
        if facts.health_token() != health_tokens[-1]:
            health_tokens.append(facts.health_token())
        routes_tokens.append(facts.routes_token())
    assert changes >= 1  # a port degrades (a port that appears healthy writes nothing)
    assert len(health_tokens) == changes + 1  # a new token per change, none otherwise
    assert set(routes_tokens) == {0}  # no plan moved anything

    def route(plan: str, via: str | None) -> Route:
        paths = (RoutePath(flow=flow, port="mlx5_7:1", via=via),)
        return Route(v=1, kind="route", node="node-000", ts_ns=1, plan=plan, paths=paths)

    facts.learn(route("p-1", None), writer)
    assert facts.routes_token() == 0  # planned, not moved
    facts.learn(route("p-2", "spine-a-0"), writer)
    moved = facts.routes_token()
    assert moved != 0
    facts.learn(route("p-3", "spine-a-0"), writer)
    assert facts.routes_token() == moved  # the same spine again: no move
    reader = Engine(shared=TableFacts(table))
    generation = reader._routes.generation()
    facts.learn(route("p-4", "spine-b-1"), writer)  # another worker learns a move
    assert reader._routes.generation() != generation


def test_table_facts_say_how_far_each_job_partition_is_learnt() -> None:
    table: dict[bytes, bytes] = {}
    facts = TableFacts(table)
    writer = Engine()
    assert facts.placed_through(3) == 0
    facts.learn_placed_through(3, 5)
    facts.learn_placed_through(3, 4)  # an older measurement: the table keeps the furthest
    assert (facts.placed_through(3), facts.placed_through(2)) == (5, 0)
    # A job named like an offset: its placement (and its end) leaves the offsets alone.
    place = (RankPlace(rank=0, node="node-000", gpu=0, port="mlx5_0:1"),)
    for state in ("running", "stopped"):
        job = Job(v=1, kind="job", job="5", ts_ns=1, state=state, ranks=place, comms={})
        writer.process(job)
        facts.learn(job, writer)
    assert facts.job_of_port("node-000/mlx5_0:1") is None and facts.placed_through(3) == 5


def test_snapshots_stretch_their_interval_to_stay_within_their_budget() -> None:
    """Periodic snapshots that take long are written less often (a tenth of the time at
    most); a finding is still saved at once."""
    clock = FakeClock()
    taking = {"s": 0.0}

    class SlowTable(dict[bytes, bytes]):
        def __setitem__(self, key: bytes, value: bytes) -> None:
            clock.now += taking["s"]  # writing a snapshot takes this long
            super().__setitem__(key, value)

    worker = _worker(SlowTable(), {}, clock)
    messages = _messages()[:400]
    list(_feed(worker, messages[:100], clock))
    store, live = worker.store, worker.live
    assert store.snapshot_every_s() == 1.0  # cheap snapshots: the configured interval
    taking["s"] = 0.5
    clock.now += 1.0
    live.on_message(messages[100])
    live.on_timer()  # a periodic round: 0.5 s per job
    assert store.snapshot_every_s() >= 5.0
    written = store.counters.written
    clock.now += 2.0
    live.on_message(messages[101])
    live.on_timer()
    assert store.counters.written == written  # 2 s later: not yet
    clock.now += store.snapshot_every_s()
    live.on_message(messages[102])
    live.on_timer()
    assert store.counters.written > written


class CountingTable(dict[bytes, bytes]):
    """A table that counts the reads and writes of health keys."""

    def __init__(self) -> None:
        super().__init__()
        self.health_reads = 0
        self.health_writes = 0

    def __contains__(self, key: object) -> bool:
        if isinstance(key, bytes) and key.startswith(b"health:"):
            self.health_reads += 1
        return super().__contains__(key)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        if key.startswith(b"health:"):
            self.health_writes += 1
        super().__setitem__(key, value)


def test_a_ports_unchanged_health_is_not_read_again_nor_a_healthy_one_written() -> None:
    messages = _messages()
    links = [m for m in messages if isinstance(m, Link)]
    table = CountingTable()
    facts = TableFacts(table)
    writer = Engine()
    for message in messages:
        writer.process(message)
        facts.learn(message, writer)
    ports = {f"{m.node}/{m.port}" for m in links}
    assert table.health_writes == 1  # a healthy port is what a missing one stands for
    assert table.health_reads == len(ports) + 1 < len(links)  # each port once, one change
    assert facts.port_health("node-004/mlx5_2:1") == (False, True)
    assert facts.port_health("node-000/mlx5_0:1") == (False, False)
    # Another worker wrote a port's health while this one did not hold its node: once this
    # worker's partitions went, what it wrote before is no longer taken for granted.
    table[b"health:node-004/mlx5_2:1"] = b"00"
    degraded = next(m for m in reversed(links) if f"{m.node}/{m.port}" == "node-004/mlx5_2:1")
    facts.learn(degraded, writer)
    assert facts.port_health("node-004/mlx5_2:1") == (False, False)  # taken as written
    facts.forget_written()
    facts.learn(degraded, writer)
    assert facts.port_health("node-004/mlx5_2:1") == (False, True)


def test_a_readers_moves_are_asked_again_once_the_routes_token_changes() -> None:
    table: dict[bytes, bytes] = {}
    facts = TableFacts(table)
    writer = Engine()
    reader = Engine(shared=TableFacts(table))
    routes = reader._routes
    flow = "job-1/c/7->8"

    def route(plan: str, via: str, ts_ns: int) -> Route:
        paths = (RoutePath(flow=flow, port="mlx5_7:1", via=via),)
        return Route(v=1, kind="route", node="node-000", ts_ns=ts_ns, plan=plan, paths=paths)

    for message in _messages()[:200]:
        writer.process(message)
    facts.learn(route("p-1", "spine-a-0", 1), writer)
    assert routes.moved_at(flow) is None  # planned, never moved
    facts.learn(route("p-2", "spine-b-1", 1), writer)  # another worker learns a move
    assert routes.moved_at(flow) is None  # as of the token read at the last check
    reader.check(writer.now_ns)
    assert routes.moved_at(flow) == writer.now_ns


def test_a_reader_keeps_a_bounded_number_of_moves() -> None:
    table: dict[bytes, bytes] = {}
    facts = TableFacts(table)
    writer = Engine()
    routes = _SharedRoutes(RouteBook(), TableFacts(table), kept=4)
    for message in _messages()[:200]:
        writer.process(message)  # a clock to date the moves with
    flows = [f"job-1/c/{i}->{i + 1}" for i in range(6)]
    for plan, via in (("p-1", "spine-a-0"), ("p-2", "spine-b-1")):
        routed = tuple(RoutePath(flow=flow, port="mlx5_7:1", via=via) for flow in flows)
        route = Route(v=1, kind="route", node="node-000", ts_ns=1, plan=plan, paths=routed)
        facts.learn(route, writer)
    routes.refresh()
    moved = [routes.moved_at(flow) for flow in flows]
    assert moved == [writer.now_ns] * 6  # each asked once, the oldest answers let go
    assert len(routes._moved) <= 4

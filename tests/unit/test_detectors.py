from __future__ import annotations

from dataclasses import dataclass

import pytest

from schemas.messages import Collective, Collectives, Diagnosis, Gpu, Link, LinkCounters, Ops
from streams.core.engine import Engine
from tests.unit.ring_job import MS, T0, RingJob, S


def diagnose(job: RingJob) -> list[Diagnosis]:
    engine = Engine()
    out = list(engine.process(job.job_message()))
    for message in job.messages():
        out.extend(engine.process(message))
    out.extend(engine.check(engine.now_ns))
    return out


@dataclass(frozen=True)
class Expect:
    name: str
    job: RingJob
    cls: str | None  # None: a healthy run, no finding at all
    suspect: str | None = None


CASES = [
    Expect("healthy", RingJob(), None),
    Expect("healthy with jitter", RingJob(jitter=0.03, seed=7), None),
    Expect("healthy with checkpoint", RingJob(pause=(50, 8 * S)), None),
    Expect("straggler gpu", RingJob(slow_rank={5: (20, 1.15)}), "noncomm_slow", "node-000/gpu5"),
    Expect(
        "straggler on 2nd node",
        RingJob(n=24, slow_rank={19: (10, 1.3)}),
        "noncomm_slow",
        "node-002/gpu3",
    ),
    Expect("2% slower gpu is normal", RingJob(slow_rank={5: (0, 1.02)}), None),
    Expect("10% slower gpu", RingJob(slow_rank={2: (20, 1.10)}), "noncomm_slow", "node-000/gpu2"),
    Expect("stuck process", RingJob(stuck_rank={11: 40}), "noncomm_hang", "node-001/gpu3"),
    Expect("node down", RingJob(n=24, dead_node={1: 40}), "node_down", "node-001"),
    Expect("stalled collective", RingJob(stall_at=50), "comm_hang", None),
    Expect("degraded port", RingJob(slow_port={6: (40, 0.5)}), "comm_slow", "node-000/mlx5_6:1"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_detector_table(case: Expect) -> None:
    found = diagnose(case.job)
    firing = [d for d in found if d.state == "firing"]
    if case.cls is None:
        assert firing == []
        return
    assert firing, "nothing found"
    assert {d.class_ for d in firing} == {case.cls}, [(d.class_, d.suspects) for d in firing]
    first = firing[0]
    if case.suspect is not None:
        assert first.suspects[0].id == case.suspect
    assert first.job == "job-1"


def test_each_finding_fires_once_and_ids_are_stable() -> None:
    job = RingJob(slow_rank={5: (20, 1.2)})
    first = diagnose(job)
    again = diagnose(job)
    assert [d.id for d in first] == [d.id for d in again]
    firing = [d for d in first if d.state == "firing"]
    assert len(firing) == len({d.id for d in firing}) == 1


def test_straggler_resolves_when_it_recovers() -> None:
    found = diagnose(RingJob(ops=200, slow_rank={5: (20, 1.2)}, slow_until=100))
    assert [(d.class_, d.state) for d in found] == [
        ("noncomm_slow", "firing"),
        ("noncomm_slow", "resolved"),
    ]
    assert found[0].id == found[1].id
    assert found[1].ts_ns > found[0].ts_ns


def test_hang_fires_after_hang_after_of_event_time() -> None:
    found = diagnose(RingJob(stuck_rank={11: 40}))
    hang = next(d for d in found if d.class_ == "noncomm_hang")
    assert 5 * S <= hang.ts_ns - hang.onset_ns <= 7 * S
    assert hang.evidence["missing_ranks"] == [11]


def test_op_time_scales_hang_after() -> None:
    slow_ops = RingJob(compute_ns=400 * MS, transfer_ns=600 * MS, stuck_rank={3: 20}, ops=40)
    hang = next(d for d in diagnose(slow_ops) if d.class_ == "noncomm_hang")
    # 20 x the median operation time (~0.6 s) = ~12 s, more than the 5 s floor
    assert hang.ts_ns - hang.onset_ns >= 11 * S


def test_comm_hang_names_the_port_that_went_down() -> None:
    job = RingJob(stall_at=50)
    engine = Engine()
    engine.process(job.job_message())
    found = []
    down_sent = False
    for message in job.messages():
        if not down_sent and message.ts_ns >= T0_PLUS(11):
            found.extend(engine.process(link("node-001", "mlx5_2:1", message.ts_ns, "down", 1)))
            down_sent = True
        found.extend(engine.process(message))
    classes = {(d.class_, d.suspects[0].id) for d in found if d.state == "firing"}
    assert ("link_down", "node-001/mlx5_2:1") in classes
    assert ("comm_hang", "node-001/mlx5_2:1") in classes
    link_down = next(d for d in found if d.class_ == "link_down")
    assert link_down.job == "job-1"  # the port's job, from the placement


def T0_PLUS(seconds: int) -> int:  # noqa: N802 - reads as a time
    from tests.unit.ring_job import T0

    return T0 + seconds * S


def link(node: str, port: str, ts: int, state: str, downs: int, symbol_err: int = 0) -> Link:
    return Link(
        v=1,
        kind="link",
        node=node,
        port=port,
        ts_ns=ts,
        state=state,
        gbps=200,
        counters=LinkCounters(link_down=downs, symbol_err=symbol_err),
    )


def test_link_counters_fire_and_resolve() -> None:
    engine = Engine()
    out = []
    errors = 0
    for second in range(20):
        errors += 50 if 5 <= second < 10 else 0
        out.extend(engine.process(link("node-3", "mlx5_0:1", T0_PLUS(second), "up", 0, errors)))
    assert [(d.class_, d.state) for d in out] == [
        ("link_degraded", "firing"),
        ("link_degraded", "resolved"),
    ]
    assert out[0].suspects[0].id == "node-3/mlx5_0:1" and out[0].job is None


def test_counter_reset_is_not_an_error_burst() -> None:
    engine = Engine()
    out = []
    for second, value in enumerate([100, 100, 0, 0, 0]):
        out.extend(engine.process(link("node-3", "mlx5_0:1", T0_PLUS(second), "up", 0, value)))
    assert out == []


@pytest.mark.parametrize(
    ("xids", "fires"), [((79,), True), ((48,), True), ((13,), False), ((31, 43), False)]
)
def test_gpu_xids(xids: tuple[int, ...], fires: bool) -> None:
    engine = Engine()
    message = Gpu(v=1, kind="gpu", node="node-2", gpu=4, ts_ns=T0_PLUS(1), xid=xids)
    out = engine.process(message)
    assert bool(out) is fires
    if fires:
        assert out[0].class_ == "gpu_fault" and out[0].suspects[0].id == "node-2/gpu4"


def test_job_parameters_override_defaults() -> None:
    engine = Engine(job_params={"job-1": {"hang_min_ns": 12 * S}})
    job = RingJob(stuck_rank={11: 40})
    out = list(engine.process(job.job_message()))
    for message in job.messages():
        out.extend(engine.process(message))
    hang = next(d for d in out if d.class_ == "noncomm_hang")
    assert hang.ts_ns - hang.onset_ns >= 12 * S


def test_ten_percent_straggler_named_within_fifty_operations() -> None:
    job = RingJob(slow_rank={2: (20, 1.10)})
    slow = next(d for d in diagnose(job) if d.class_ == "noncomm_slow")
    period_ns = job.compute_ns + job.transfer_ns
    onset_ns = T0_PLUS(0) + 20 * period_ns
    assert slow.ts_ns - onset_ns <= 50 * period_ns


def test_a_node_coming_back_is_no_new_hang_while_its_ranks_rejoin() -> None:
    # Node-001 goes dark at op 40 (node_down), then comes back: its eight ranks report again
    # one every 0.3 s, each entering op 40, which the others still wait in. Until the last of
    # them is back, the missing ones are the node rejoining, not a hang of their own.
    job = RingJob(n=24, dead_node={1: 40})
    engine = Engine()
    messages = job.messages()
    found = [d for m in [job.job_message(), *messages] for d in engine.process(m)]
    assert [(d.class_, d.state) for d in found] == [("node_down", "firing")]
    last = messages[-1].ts_ns
    waiting = {m.rank: m for m in messages if m.ts_ns == last}
    template = next(m for m in messages if m.rank == 8)
    rejoin = []
    for step, rank in enumerate(range(8, 16), start=1):
        at = last + step * 300 * MS
        ops = Ops(seq=(40,), op=("allreduce",), bytes=(64 * MS,), enter_ns=(at,), end_ns=(None,))
        rejoin.append(
            template.model_copy(
                update={"rank": rank, "global_rank": rank, "gpu": rank % 8, "ts_ns": at, "ops": ops}
            )
        )
        for report in waiting.values():  # the others keep heartbeating meanwhile
            rejoin.append(
                report.model_copy(
                    update={
                        "ts_ns": at,
                        "ops": Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=()),
                    }
                )
            )
    after = [d for m in rejoin for d in engine.process(m)]
    assert [(d.class_, d.state) for d in after] == [("node_down", "resolved")], after


def test_a_lost_report_is_no_hang_the_rank_went_on() -> None:
    # One report of rank 3 never arrives (an agent killed before delivering it, a detector
    # restored from a snapshot older than its committed offsets): the operations it entered
    # and finished in that interval are never reported again. Its later reports show it went
    # on: operations of one communicator are entered and finish in order.
    job = RingJob(ops=120)
    messages = job.messages()
    lost = next(m for m in messages if m.rank == 3 and m.ts_ns > T0 + 8 * S and any(m.ops.end_ns))
    assert any(e is not None for e in lost.ops.end_ns)
    engine = Engine()
    found = [d for m in [job.job_message(), *messages] if m is not lost for d in engine.process(m)]
    assert found == []
    tracker = engine.jobs["job-1"].comms["c0"]
    assert not any(seq in tracker.pending for seq in lost.ops.seq)


def test_a_detector_restored_from_an_older_snapshot_is_no_node_down() -> None:
    # The snapshot is older than the offsets the worker goes on from: the reports between
    # are never seen again, and the first node to report after the gap is seconds ahead.
    job = RingJob(n=24)
    messages = job.messages()
    engine = Engine()
    cut = T0 + (messages[-1].ts_ns - T0) // 3
    for m in [job.job_message(), *(m for m in messages if m.ts_ns < cut)]:
        engine.process(m)
    state = engine.job_state("job-1")
    assert state is not None
    restored = Engine()
    restored.restore_job("job-1", state)
    resume = cut + 6 * S
    later = sorted((m for m in messages if m.ts_ns >= resume), key=lambda m: (m.ts_ns, -m.rank))
    found = [d for m in later for d in restored.process(m)]
    assert [d for d in found if d.class_ in ("node_down", "noncomm_hang")] == []
    # A node that stays silent after the gap is still named, silent_after past the gap: one
    # that went down (its ranks enter nothing more, so no operation of theirs finishes). Its
    # reports alone missing while the others finish operations it takes part in is a node
    # up whose reports are behind (tests/unit/test_node_spool_replay.py).
    first_op = min(seq for m in later for seq in m.ops.seq)
    dead = RingJob(n=24, dead_node={1: first_op})
    after = sorted((m for m in dead.messages() if m.ts_ns >= resume), key=lambda m: m.ts_ns)
    again = Engine()
    again.restore_job("job-1", state)
    found = [d for m in after for d in again.process(m)]
    assert [(d.class_, d.suspects[0].id) for d in found if d.class_ == "node_down"] == [
        ("node_down", "node-001")
    ]


def test_a_gap_in_the_whole_job_s_reports_is_no_node_down() -> None:
    # Six seconds of the job's records never arrive (a broker outage that skipped them, an
    # agent that lost its spool): when they come again, the first node to report is no
    # sign that the others are gone. Offline as live.
    job = RingJob(n=24)
    messages = job.messages()
    cut = T0 + (messages[-1].ts_ns - T0) // 3
    kept = [m for m in messages if not cut <= m.ts_ns < cut + 6 * S]
    kept.sort(key=lambda m: (m.ts_ns, -m.rank))  # node-002's ranks first in each interval
    engine = Engine()
    found = [d for m in [job.job_message(), *kept] for d in engine.process(m)]
    assert [d for d in found if d.class_ in ("node_down", "noncomm_hang")] == []


def presence(node: str, ts_ns: int) -> Collectives:
    """What a node's agent sends while the job's ranks on it say nothing."""
    return Collectives(v=1, kind="collectives", job="job-1", node=node, ts_ns=ts_ns, messages=())


def with_agent(node: str, messages: list[Collective]) -> list[Collective | Collectives]:
    """The reports with the node's agent saying it is up every half second, in time order."""
    end = max(m.ts_ns for m in messages)
    agent = [presence(node, ts) for ts in range(T0, end, S // 2)]
    return sorted([*messages, *agent], key=lambda m: m.ts_ns)


def firing_in(job: RingJob, timeline: list[Collective | Collectives]) -> list[Diagnosis]:
    engine = Engine()
    found = [d for m in [job.job_message(), *timeline] for d in engine.process(m)]
    return [d for d in found if d.state == "firing"]


def test_ranks_silent_on_a_node_whose_agent_is_up_are_a_hang_naming_them() -> None:
    # Every rank of node-001 stops (SIGSTOP, a crash) while the node's agent goes on: the
    # node is up, its ranks hang; without the agent's word the same reports read as the
    # node down.
    job = RingJob(n=24, dead_node={1: 40})
    timeline = with_agent("node-001", job.messages())
    end = timeline[-1].ts_ns
    firing = firing_in(job, timeline)
    assert [d.class_ for d in firing] == ["noncomm_hang"], [(d.class_, d.suspects) for d in firing]
    assert {s.id.split("/")[0] for s in firing[0].suspects} == {"node-001"}
    assert {d.class_ for d in diagnose(job) if d.state == "firing"} == {"node_down"}
    # A worker that takes the job over from a snapshot knows the agent was up.
    half = [m for m in timeline if m.ts_ns < T0 + (end - T0) // 2]
    first = Engine()
    for m in [job.job_message(), *half]:
        first.process(m)
    state = first.job_state("job-1")
    assert state is not None and state["agents"]["node-001"] > T0
    second = Engine()
    second.restore_job("job-1", state)
    rest = [m for m in timeline if m not in half]
    assert "node_down" not in {d.class_ for m in rest for d in second.process(m)}


def test_ranks_that_go_silent_inside_an_operation_on_a_live_node_are_named() -> None:
    # Every rank entered op 50 and none finishes; node-001's ranks stop reporting right after
    # entering it (stopped inside the collective) while the others report on and node-001's
    # agent says the node is up: those processes stopped, not the network (comm_hang).
    job = RingJob(n=24, stall_at=50)
    messages = job.messages()
    entered = min(
        m.ts_ns for m in messages if m.node == "node-001" and 50 in m.ops.seq
    )  # the report that shows node-001's ranks inside op 50
    kept = [m for m in messages if m.node != "node-001" or m.ts_ns <= entered]
    firing = firing_in(job, with_agent("node-001", kept))
    assert [d.class_ for d in firing] == ["noncomm_hang"], [(d.class_, d.suspects) for d in firing]
    assert {s.id.split("/")[0] for s in firing[0].suspects} == {"node-001"}
    assert firing[0].evidence["silent_ranks"] == list(range(8, 16))
    # Every rank reporting on: the network (comm_hang), as before.
    assert {d.class_ for d in diagnose(job) if d.state == "firing"} == {"comm_hang"}


def test_a_rank_stopped_before_it_recorded_an_end_is_no_waiter() -> None:
    # node-001's ranks stop after their last operation completed everywhere but before
    # they recorded its end: inside it for ever by their reports, silent since, while the
    # others wait for them in the next one. They are the culprits, not waiters.
    job = RingJob(n=24, dead_node={1: 40})
    messages = job.messages()
    last = {}
    for m in messages:
        if m.node == "node-001" and len(m.ops.seq):
            last[m.rank] = m
    edited = []
    for m in messages:
        if last.get(m.rank) is m:
            ends = (*m.ops.end_ns[:-1], None)
            m = m.model_copy(update={"ops": m.ops.model_copy(update={"end_ns": ends})})
        edited.append(m)
    firing = firing_in(job, with_agent("node-001", edited))
    assert [(d.class_, {s.id.split("/")[0] for s in d.suspects}) for d in firing] == [
        ("noncomm_hang", {"node-001"})
    ]

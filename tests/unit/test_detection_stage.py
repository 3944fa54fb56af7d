"""The stage interface (`streams.core.stage`): which key a message and a finding belong to,
what the timer moves, and a key dropped or restored on its own."""

from __future__ import annotations

from schemas.messages import Diagnosis, Job, Link, LinkCounters, Route, RoutePath
from streams.core.engine import Engine
from streams.core.stage import JOB, NODE, StateKey, finding_key, state_key
from tests.unit.ring_job import T0, RingJob, S


def _diagnosis(cls: str, job: str | None, suspect: tuple[str, str]) -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": "d-1",
            "job": job,
            "state": "firing",
            "class": cls,
            "onset_ns": T0,
            "ts_ns": T0,
            "suspects": [{"type": suspect[0], "id": suspect[1], "score": 0.9}],
        }
    )


def test_a_message_belongs_to_its_job_or_its_node_and_a_plan_to_no_key() -> None:
    job = RingJob()
    link = Link(
        v=1,
        kind="link",
        node="node-004",
        port="mlx5_2:1",
        ts_ns=T0,
        state="up",
        counters=LinkCounters(),
    )
    route = Route(
        v=1,
        kind="route",
        node="node-000",
        ts_ns=T0,
        plan="p-1",
        paths=(RoutePath(flow="job-1/c/0->1", port="mlx5_0:1", via=None),),
    )
    assert state_key(job.job_message()) == StateKey(JOB, "job-1")
    assert state_key(job.messages()[0]) == StateKey(JOB, "job-1")
    assert state_key(link) == StateKey(NODE, "node-004")
    assert state_key(route) is None


def test_a_hardware_finding_is_kept_with_its_node_any_other_with_its_job() -> None:
    port = ("port", "node-004/mlx5_2:1")
    assert finding_key(_diagnosis("link_down", "job-1", port)) == StateKey(NODE, "node-004")
    assert finding_key(_diagnosis("gpu_fault", None, ("gpu", "node-002/gpu3"))) == StateKey(
        NODE, "node-002"
    )
    # A degraded link is the port's node's when a port is its suspect, else its job's.
    assert finding_key(_diagnosis("link_degraded", "job-1", port)) == StateKey(NODE, "node-004")
    switch = ("switch", "leaf-0-7")
    assert finding_key(_diagnosis("link_degraded", "job-1", switch)) == StateKey(JOB, "job-1")
    assert finding_key(_diagnosis("link_degraded", None, switch)) is None  # the fabric's
    rank = ("rank", "5")
    assert finding_key(_diagnosis("noncomm_hang", "job-1", rank)) == StateKey(JOB, "job-1")


def test_the_timer_moves_the_clock_forward_only() -> None:
    stage = Engine()
    job = RingJob(stuck_rank={11: 40})
    hang_start = T0 + 40 * (job.compute_ns + job.transfer_ns)
    for message in [job.job_message(), *job.messages()]:
        if message.ts_ns > hang_start + 3.5 * S:
            break
        assert stage.on_message(message) == []
    now = stage.now_ns
    assert stage.on_timer(0) == [] and stage.now_ns == now  # not ahead: nothing moves
    fired = stage.on_timer(now + 30 * S)  # the input silent for 30 s
    assert [d.class_ for d in fired] == ["noncomm_hang"] and stage.now_ns == now + 30 * S


def test_a_key_dropped_is_gone_and_its_snapshot_brings_it_back() -> None:
    stage = Engine()
    one, two = RingJob(job="job-1"), RingJob(job="job-2", first_node=2, seed=2)
    for message in [one.job_message(), two.job_message(), *one.messages(), *two.messages()]:
        stage.on_message(message)
    key = StateKey(JOB, "job-2")
    assert stage.keys(JOB) == [StateKey(JOB, "job-1"), key]
    state = stage.snapshot([key])[key]
    stage.drop(key)
    assert stage.keys(JOB) == [StateKey(JOB, "job-1")] and stage.snapshot([key]) == {}
    stage.restore(key, state)
    assert stage.keys(JOB) == [StateKey(JOB, "job-1"), key]
    assert stage.snapshot([key])[key] == state
    stopped = Job(v=1, kind="job", job="job-2", ts_ns=T0, state="stopped", ranks=(), comms={})
    stage.on_message(stopped)
    assert stage.keys(JOB) == [StateKey(JOB, "job-1")]

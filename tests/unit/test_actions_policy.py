"""The policy stage: class map, minimum score, blast radius, restart verdicts, receivers."""

from __future__ import annotations

from typing import Any

import pytest

from actions.config import WorkerConfig, parse_config
from actions.pipeline.outcome import Reason
from actions.pipeline.policy import Plan, View, node_of, plan, shared_switch
from schemas.messages import Diagnosis, Suspect

LEAVES = {f"node-00{i}": ("leaf-0a", "leaf-0b") for i in range(8)}
JOB_NODES = frozenset({"node-001", "node-002", "node-003"})


def diagnosis(
    suspects: list[tuple[str, str, float]],
    cls: str = "noncomm_hang",
    job: str | None = "job-1",
    state: str = "firing",
) -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": "d-1",
            "job": job,
            "state": state,
            "class": cls,
            "onset_ns": 1,
            "ts_ns": 2,
            "suspects": [{"type": t, "id": i, "score": s} for t, i, s in suspects],
        }
    )


def configured(**data: Any) -> WorkerConfig:
    data.setdefault("receivers", [{"name": "oncall", "url": "http://127.0.0.1:1/a"}])
    return parse_config(data, {})


def summary(planned: Plan) -> list[tuple[str, str, str | None]]:
    return [
        (step.action, step.target, step.verdict.reason if step.verdict else None)
        for step in planned.steps
    ]


def test_a_hang_isolates_the_gpus_node_restarts_the_job_and_alerts() -> None:
    planned = plan(
        diagnosis([("gpu", "node-002/gpu3", 0.97)]), View(job_nodes=JOB_NODES), configured()
    )
    assert summary(planned) == [
        ("isolate", "node-002", None),
        ("restart", "job-1", None),
        ("alert", "node-002/gpu3", None),
    ]
    assert planned.steps[1].nodes == ("node-002",)
    assert planned.marks == ()


def test_slow_classes_alert_and_mark_their_suspects() -> None:
    planned = plan(
        diagnosis([("port", "node-002/mlx5_0:1", 0.9)], cls="comm_slow"), View(), configured()
    )
    assert summary(planned) == [("alert", "node-002/mlx5_0:1", None)]
    assert planned.marks == (("port", "node-002/mlx5_0:1"),)


def test_below_the_minimum_score_nothing_changes_state_but_the_alert_goes() -> None:
    planned = plan(
        diagnosis([("gpu", "node-002/gpu3", 0.3)]),
        View(job_nodes=JOB_NODES),
        configured(policy={"min_score": 0.5}),
    )
    assert summary(planned) == [
        ("isolate", "node-002/gpu3", Reason.BELOW_MIN_SCORE),
        ("restart", "node-002/gpu3", Reason.BELOW_MIN_SCORE),
        ("alert", "node-002/gpu3", None),
    ]


def test_more_than_k_nodes_at_once_isolate_nothing_and_escalate_the_shared_leaf() -> None:
    suspects = [("node", f"node-00{i}", 0.8) for i in range(5)]
    planned = plan(
        diagnosis(suspects),
        View(job_nodes=frozenset(LEAVES), node_leaves=LEAVES),
        configured(policy={"blast_radius": 4}),
    )
    isolations = [s for s in planned.steps if s.action == "isolate"]
    assert len(isolations) == 5
    assert {s.verdict.reason for s in isolations if s.verdict} == {Reason.BLAST_RADIUS}
    restart = next(s for s in planned.steps if s.action == "restart")
    assert restart.verdict is not None
    assert restart.verdict.reason is Reason.BLAST_RADIUS
    alert = next(s for s in planned.steps if s.action == "alert")
    assert (alert.target, alert.escalation, alert.verdict) == ("leaf-0a", True, None)
    assert ("switch", "leaf-0a") in planned.marks


def test_k_nodes_is_still_within_the_blast_radius() -> None:
    suspects = [("node", f"node-00{i}", 0.8) for i in range(4)]
    planned = plan(
        diagnosis(suspects),
        View(job_nodes=frozenset(LEAVES), node_leaves=LEAVES),
        configured(policy={"blast_radius": 4}),
    )
    assert [s.target for s in planned.steps if s.action == "isolate" and not s.verdict] == [
        "node-000",
        "node-001",
        "node-002",
        "node-003",
    ]


def test_recent_suspects_of_the_same_job_count_towards_the_blast_radius() -> None:
    planned = plan(
        diagnosis([("gpu", "node-004/gpu0", 0.9)]),
        View(
            job_nodes=frozenset(LEAVES),
            recent_suspects=frozenset({"node-000", "node-001", "node-002", "node-003"}),
            node_leaves=LEAVES,
        ),
        configured(policy={"blast_radius": 4}),
    )
    assert all(s.verdict for s in planned.steps if s.action in {"isolate", "restart"})
    assert any(s.escalation for s in planned.steps)


@pytest.mark.parametrize(
    ("job", "view", "reason"),
    [
        (None, View(), Reason.NO_JOB),
        ("job-1", View(), Reason.UNKNOWN_JOB),
        ("job-1", View(job_nodes=frozenset({"node-007"})), Reason.NOT_IN_JOB),
    ],
)
def test_restart_verdicts(job: str | None, view: View, reason: Reason) -> None:
    planned = plan(diagnosis([("gpu", "node-002/gpu3", 0.97)], job=job), view, configured())
    restart = next(s for s in planned.steps if s.action == "restart")
    assert restart.verdict is not None
    assert restart.verdict.reason is reason


def test_receiver_filters_choose_who_is_alerted() -> None:
    receivers = [
        {"name": "hangs", "url": "http://h/", "classes": ["noncomm_hang"]},
        {"name": "big-jobs", "url": "http://b/", "jobs": ["big-.*"]},
        {"name": "sure", "url": "http://s/", "min_score": 0.99},
        {"name": "resolutions", "url": "http://r/", "states": ["resolved"]},
    ]
    config = configured(receivers=receivers)
    found = plan(diagnosis([("gpu", "node-002/gpu3", 0.97)]), View(job_nodes=JOB_NODES), config)
    assert [s.receiver for s in found.steps if s.action == "alert"] == ["hangs"]
    resolved = plan(
        diagnosis([("gpu", "node-002/gpu3", 0.97)], job="big-7", state="resolved"), View(), config
    )
    assert [s.receiver for s in resolved.steps] == ["hangs", "big-jobs", "resolutions"]
    assert resolved.clears


def test_no_matching_receiver_is_a_recorded_skip() -> None:
    planned = plan(
        diagnosis([("link", "leaf-0a~spine-0", 0.9)], cls="link_down", job=None),
        View(),
        configured(receivers=[]),
    )
    assert summary(planned) == [
        ("reroute", "leaf-0a~spine-0", None),
        ("alert", "leaf-0a~spine-0", Reason.NO_RECEIVER),
    ]


def test_classes_without_alert_alert_only_when_something_failed() -> None:
    config = configured(policy={"classes": {"noncomm_hang": ["isolate", "restart"]}})
    planned = plan(diagnosis([("gpu", "node-002/gpu3", 0.97)]), View(job_nodes=JOB_NODES), config)
    alert = planned.steps[-1]
    assert (alert.action, alert.conditional) == ("alert", True)


def test_a_class_without_actions_is_recorded_as_such() -> None:
    config = configured(policy={"classes": {"noncomm_hang": ["alert"]}})
    planned = plan(diagnosis([("gpu", "node-002/gpu3", 0.97)], cls="gpu_fault"), View(), config)
    assert summary(planned) == [("alert", "node-002/gpu3", Reason.NO_POLICY)]


def test_other_registered_actions_get_one_step_per_confident_suspect() -> None:
    config = configured(policy={"classes": {"link_down": ["reroute", "alert"]}})
    planned = plan(
        diagnosis(
            [("link", "leaf-0a~spine-0", 0.9), ("port", "node-001/mlx5_0:1", 0.2)], "link_down"
        ),
        View(job_nodes=JOB_NODES),
        config,
    )
    assert summary(planned)[0] == ("reroute", "leaf-0a~spine-0", None)
    assert [s.action for s in planned.steps] == ["reroute", "alert"]


@pytest.mark.parametrize(
    ("suspect", "node"),
    [
        (("gpu", "node-003/gpu1"), "node-003"),
        (("node", "node-004"), "node-004"),
        (("rank", "job-1/rank5"), "node-002"),
        (("rank", "job-1/rank9"), None),
        (("gpu", "gpu1"), None),
        (("port", "node-003/mlx5_0:1"), None),
    ],
)
def test_node_of_a_suspect(suspect: tuple[str, str], node: str | None) -> None:
    kind, ident = suspect
    found = node_of(
        Suspect.model_validate({"type": kind, "id": ident, "score": 1.0}), {5: "node-002"}
    )
    assert found == node


def test_shared_switch_is_the_leaf_of_most_nodes_lowest_id_on_ties() -> None:
    leaves = {"a": ("leaf-1",), "b": ("leaf-1", "leaf-2"), "c": ("leaf-2",), "d": ("leaf-2",)}
    assert shared_switch(("a", "b", "c", "d"), leaves) == "leaf-2"
    assert shared_switch(("a", "b"), leaves) == "leaf-1"
    assert shared_switch(("x",), leaves) is None


def test_a_cable_named_as_a_link_is_isolated_as_its_port() -> None:
    config = configured(policy={"classes": {"link_down": ["isolate"]}})
    planned = plan(
        diagnosis(
            [("link", "node-001/mlx5_0:1", 0.9), ("link", "leaf-0a~spine-a-0", 0.9)], "link_down"
        ),
        View(),
        config,
    )
    assert [(s.kind, s.target) for s in planned.steps if s.action == "isolate"] == [
        ("port", "node-001/mlx5_0:1"),
        ("link", "leaf-0a~spine-a-0"),
    ]


def test_a_resolved_diagnosis_runs_the_actions_that_undo() -> None:
    suspects = [("link", "leaf-0a~spine-0", 0.9), ("port", "node-001/mlx5_0:1", 0.2)]
    resolved = diagnosis(suspects, "link_down", job=None, state="resolved")
    config = configured()
    planned = plan(resolved, View(), config, frozenset({"reroute"}))
    assert summary(planned) == [
        ("reroute", "leaf-0a~spine-0", None),
        ("alert", "leaf-0a~spine-0", None),
    ]
    assert planned.clears and not planned.steps[-1].conditional
    # An action that does not undo gets no step on resolution.
    assert summary(plan(resolved, View(), config)) == [("alert", "leaf-0a~spine-0", None)]
    # Without alert in the class, the alert goes only if giving the link back failed.
    quiet = configured(policy={"classes": {"link_down": ["reroute"]}})
    steps = plan(resolved, View(), quiet, frozenset({"reroute"})).steps
    assert [(s.action, s.conditional) for s in steps] == [("reroute", False), ("alert", True)]
    assert plan(resolved, View(), quiet).steps == ()

"""The action worker against real Kafka, real Redis and a real local HTTP receiver."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import orjson
import pytest

from actions.drivers.reroute.plan_store import PlanStore
from actions.webhook import SIGNATURE_HEADER, verify
from schemas.codec import decode
from schemas.messages import Action, Deadletter, Job
from tests.integration.actions_harness import (
    SECRET,
    Cluster,
    HttpReceiver,
    config,
    diagnosis,
    free_port,
    wait_for,
    worker,
)
from tests.integration.workers import REPO

pytestmark = pytest.mark.integration

JOB_NODES = ["node-008", "node-009", "node-010"]


def by_action(actions: list[Action]) -> dict[str, list[Action]]:
    found: dict[str, list[Action]] = {}
    for action in actions:
        found.setdefault(action.action, []).append(action)
    return found


def restarting(cluster: Cluster) -> list[Job]:
    jobs = [decode(value, "job") for value in cluster.messages("job")]
    return [job for job in jobs if isinstance(job, Job) and job.state == "restarting"]


def test_noncomm_hang_isolates_restarts_on_a_same_leaf_spare_and_alerts(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    # node-003 sorts first but hangs off another leaf; node-012 shares node-009's leaves.
    cluster.spares("node-003", "node-012")
    with worker(cluster, config(receiver)):
        cluster.job("job-42", JOB_NODES)
        cluster.send("diagnosis", diagnosis("d-1", "job-42", [("gpu", "node-009/gpu1", 0.97)]))
        actions = by_action(cluster.wait_actions(3))

    assert [(a.target, a.status) for a in actions["isolate"]] == [("node-009", "done")]
    restart = actions["restart"]
    assert [(a.target, a.status) for a in restart] == [("job-42", "done")]
    assert restart[0].detail["replaced"] == {"node-009": "node-012"}
    assert restart[0].detail["tiers"] == {"node-012": "same leaf"}
    assert [(a.status, a.detail["receiver"]) for a in actions["alert"]] == [("done", "oncall")]

    state = cluster.state
    isolated = state.components.component("node", "node-009")
    assert isolated is not None
    assert (isolated.state, isolated.diagnosis) == ("isolated", "d-1")
    assert state.snapshot()["spares"] == ["node-003"]
    placement = state.jobs.placement("job-42")
    assert placement is not None
    assert sorted({p.node for p in placement.values()}) == ["node-008", "node-010", "node-012"]
    info = state.jobs.info("job-42")
    assert (info["state"], info["restarts"]) == ("restarting", "1")

    published = wait_for(lambda: restarting(cluster), what="restarting placement on c4.job.v1")
    assert len(published) == 1
    assert {p.node for p in published[0].ranks} == {"node-008", "node-010", "node-012"}

    launches = receiver.at("/launch")
    assert len(launches) == 1
    assert launches[0].headers["Idempotency-Key"] == "d-1:job-42"
    assert launches[0].json()["replaced"] == {"node-009": "node-012"}

    alerts = receiver.at("/alert")
    assert len(alerts) == 1
    assert verify(SECRET.encode(), alerts[0].body, alerts[0].headers[SIGNATURE_HEADER])
    body = alerts[0].json()
    assert body["version"] == "4"
    assert body["status"] == "firing"
    alert = body["alerts"][0]
    assert alert["labels"]["class"] == "noncomm_hang"
    assert alert["labels"]["training_job"] == alert["labels"]["job"] == "job-42"
    assert alert["labels"]["suspect"] == "node-009/gpu1"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert len(alert["fingerprint"]) == 16
    assert orjson.loads(alert["annotations"]["evidence"])["waiting_ranks"] == 14
    assert "restart job-42: done" in alert["annotations"]["actions"]

    audit = [(e["action"], e["target"]) for e in state.audit.entries()]
    assert ("isolate", "node-009") in audit
    assert ("allocate", "node-012") in audit
    assert ("restart", "job-42") in audit


def test_a_duplicate_and_a_racing_worker_give_exactly_one_of_each_action(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    cluster.spares("node-012", "node-013")
    message = diagnosis("d-2", "job-7", [("gpu", "node-009/gpu0", 0.9)])
    with (
        worker(cluster, config(receiver), group="one") as one,
        worker(cluster, config(receiver), group="two") as two,
    ):
        cluster.job("job-7", JOB_NODES)
        cluster.send("diagnosis", message)
        cluster.send("diagnosis", message)

        def taken() -> bool:
            # Each worker (its own consumer group) saw both deliveries: 4 in all.
            total = 0.0
            for metrics in (one, two):
                for outcome in ("handled", "duplicate", "fenced"):
                    total += metrics.diagnoses.labels(outcome)._value.get()
            return total >= 4

        wait_for(taken, 60, "both workers to take both deliveries")
        actions = cluster.actions()

    assert Counter(a.action for a in actions) == {"isolate": 1, "restart": 1, "alert": 1}
    assert all(a.status == "done" for a in actions)
    assert len(receiver.at("/launch")) == 1
    assert len(receiver.at("/alert")) == 1
    assert len(cluster.state.snapshot()["spares"]) == 1
    assert len(restarting(cluster)) == 1


def test_five_suspect_nodes_of_one_job_isolate_nothing_and_escalate_the_switch(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    nodes = [f"node-00{i}" for i in range(6)]
    cluster.spares("node-012")
    with worker(cluster, config(receiver, policy={"blast_radius": 4})):
        cluster.job("job-9", nodes)
        suspects = [("node", node, 0.8) for node in nodes[:5]]
        cluster.send("diagnosis", diagnosis("d-3", "job-9", suspects))
        actions = by_action(cluster.wait_actions(7))

    assert sorted(a.target for a in actions["isolate"]) == nodes[:5]
    assert {(a.status, a.detail["reason"]) for a in actions["isolate"]} == {
        ("skipped", "blast_radius")
    }
    assert [(a.status, a.detail["reason"]) for a in actions["restart"]] == [
        ("skipped", "blast_radius")
    ]
    assert [(a.target, a.status) for a in actions["alert"]] == [("leaf-0a", "done")]
    assert actions["alert"][0].detail["escalation"] == "blast_radius"

    snapshot = cluster.state.snapshot()
    assert snapshot["components"]["node"]["counts"]["isolated"] == 0
    switch = cluster.state.components.component("switch", "leaf-0a")
    assert switch is not None
    assert (switch.state, switch.diagnosis) == ("suspect", "d-3")
    assert snapshot["spares"] == ["node-012"]
    alert = receiver.at("/alert")[0].json()["alerts"][0]
    assert alert["labels"]["alertname"] == "C4Escalation"
    assert alert["labels"]["suspect"] == "leaf-0a"
    assert alert["annotations"]["nodes"] == ", ".join(nodes[:5])


def test_no_spare_left_fails_the_restart_with_a_reason_and_an_alert_writing_nothing(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    cluster.spares("node-012")  # one spare for two failed nodes: nothing may be taken
    with worker(cluster, config(receiver)):
        cluster.job("job-5", JOB_NODES)
        before = cluster.state.jobs.placement("job-5")
        suspects = [("gpu", "node-008/gpu0", 0.9), ("gpu", "node-010/gpu1", 0.9)]
        cluster.send("diagnosis", diagnosis("d-4", "job-5", suspects))
        actions = by_action(cluster.wait_actions(4))

    restart = actions["restart"][0]
    assert restart.status == "failed"
    assert restart.detail["reason"] == "no_spare"
    assert "no spare node left to replace node-010" in str(restart.detail["message"])
    assert cluster.state.jobs.placement("job-5") == before
    assert cluster.state.jobs.info("job-5")["restarts"] == "0"
    assert cluster.state.jobs.info("job-5")["state"] == "running"
    assert cluster.state.snapshot()["spares"] == ["node-012"]
    assert restarting(cluster) == []
    assert receiver.at("/launch") == []
    alert = receiver.at("/alert")[0].json()["alerts"][0]
    assert alert["labels"]["severity"] == "critical"
    assert "no_spare" in alert["annotations"]["actions"]


def test_receivers_retried_on_5xx_not_on_4xx_and_dead_lettered_when_down(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    receiver.scripts["/flaky"] = [500, 500]
    receiver.scripts["/picky"] = [400]
    fast = {"tries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2}
    receivers = [
        {"name": "flaky", "url": receiver.url("/flaky"), "retry": fast},
        {"name": "picky", "url": receiver.url("/picky"), "retry": fast},
        {"name": "down", "url": f"http://127.0.0.1:{free_port()}/x", "retry": fast},
    ]
    with worker(cluster, config(receivers=receivers)):
        message = diagnosis("d-5", None, [("link", "leaf-0a~spine-a-0", 0.9)], cls="comm_slow")
        cluster.send("diagnosis", message, key="fabric")
        actions = {a.detail["receiver"]: a for a in cluster.wait_actions(3)}
        letters = wait_for(lambda: cluster.messages("deadletter"), what="a dead letter")

    assert len(receiver.at("/flaky")) == 3
    assert (actions["flaky"].status, actions["flaky"].detail["tries"]) == ("done", 3)
    assert len(receiver.at("/picky")) == 1
    assert actions["picky"].status == "failed"
    assert actions["picky"].detail["reason"] == "receiver_rejected"
    assert "tries" not in actions["picky"].detail
    assert actions["down"].status == "failed"
    assert actions["down"].detail["reason"] == "receiver_unavailable"
    assert actions["down"].detail["tries"] == 3
    decoded = [decode(value, "deadletter") for value in letters]
    assert all(isinstance(d, Deadletter) for d in decoded)
    topics = sorted(d.topic for d in decoded if isinstance(d, Deadletter))
    assert topics == ["webhook:down", "webhook:picky"]
    down = next(d for d in decoded if isinstance(d, Deadletter) and d.topic == "webhook:down")
    assert orjson.loads(down.payload)["version"] == "4"


def test_malformed_diagnoses_are_dead_lettered_and_the_worker_goes_on(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    with worker(cluster, config(receiver)) as metrics:
        cluster.send("diagnosis", b"{not json")
        cluster.send("diagnosis", {"v": 1, "kind": "diagnosis", "id": "d-x"})
        broken = diagnosis("d-y", "job-1", [("gpu", "node-001/gpu0", 1.5)])
        cluster.send("diagnosis", broken)
        good = diagnosis("d-6", None, [("switch", "leaf-1a", 0.9)], cls="link_degraded")
        cluster.send("diagnosis", good, key="fabric")
        actions = cluster.wait_actions(2)
        letters = wait_for(
            lambda: len(found := cluster.messages("deadletter")) >= 3 and found, what="3 letters"
        )
        assert metrics.diagnoses.labels("rejected")._value.get() == 3

    assert [(a.diagnosis, a.action, a.status) for a in actions] == [
        ("d-6", "reroute", "done"),
        ("d-6", "alert", "done"),
    ]
    errors = [decode(value, "deadletter") for value in letters]
    reasons = [d.error for d in errors if isinstance(d, Deadletter)]
    assert reasons[0].startswith("invalid JSON")
    assert reasons[1] == "job: required field missing (and 5 more)"
    assert reasons[2].startswith("suspects[0].score: should be less than or equal to 1")
    suspect = cluster.state.components.component("switch", "leaf-1a")
    assert suspect is not None
    assert suspect.state == "suspect"


def test_dry_run_records_decisions_and_changes_nothing(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    cluster.spares("node-012")
    with worker(cluster, config(receiver), dry_run=True):
        cluster.job("job-3", JOB_NODES)
        cluster.send("diagnosis", diagnosis("d-7", "job-3", [("gpu", "node-009/gpu1", 0.97)]))
        actions = cluster.wait_actions(3)

    assert {(a.action, a.status, a.detail["reason"]) for a in actions} == {
        ("isolate", "skipped", "dry_run"),
        ("restart", "skipped", "dry_run"),
        ("alert", "skipped", "dry_run"),
    }
    node = cluster.state.components.component("node", "node-009")
    assert node is not None
    assert node.state == "healthy"
    assert cluster.state.snapshot()["spares"] == ["node-012"]
    assert receiver.requests == []
    entries = cluster.state.audit.entries()
    assert entries == [e for e in entries if e["action"] == "spare"]


def test_a_resolved_finding_clears_its_suspect_marks_and_resolves_the_alert(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    firing = diagnosis("d-8", None, [("link", "leaf-0a~spine-a-0", 0.9)], cls="link_degraded")
    resolved = {**firing, "state": "resolved", "ts_ns": firing["ts_ns"] + 10**9}
    with worker(cluster, config(receiver)):
        cluster.send("diagnosis", firing, key="fabric")
        cluster.wait_actions(2)
        link = cluster.state.components.component("link", "leaf-0a~spine-a-0")
        assert link is not None
        assert (link.state, link.diagnosis) == ("suspect", "d-8")
        cluster.send("diagnosis", resolved, key="fabric")
        actions = cluster.wait_actions(4)

    assert [(a.action, a.detail["state"], a.status) for a in actions] == [
        ("reroute", "firing", "done"),
        ("alert", "firing", "done"),
        ("reroute", "resolved", "skipped"),
        ("alert", "resolved", "done"),
    ]
    # The correlator's finding resolved after the reroute: its link stays out of the plan,
    # and out of service until an operator releases it.
    assert actions[2].detail["reason"] == "kept_out"
    link = cluster.state.components.component("link", "leaf-0a~spine-a-0")
    assert link is not None
    assert (link.state, link.diagnosis) == ("isolated", "d-8")
    first, second = (request.json()["alerts"][0] for request in receiver.at("/alert"))
    assert (first["status"], second["status"]) == ("firing", "resolved")
    assert first["fingerprint"] == second["fingerprint"]
    plans = PlanStore(cluster.state.client, f"{cluster.key_prefix}:plan:")
    kept = plans.current()
    assert kept is not None and kept.down == ("leaf-0a~spine-a-0",)

    released = subprocess.run(
        [sys.executable, "-m", "c4.cli", "state", "release", "leaf-0a~spine-a-0"],
        env=dict(os.environ, PYTHONPATH=str(REPO), **cluster.env()),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert released.returncode == 0, released.stderr
    lines = released.stdout.strip().splitlines()
    assert lines[0].startswith("link leaf-0a~spine-a-0 released")
    assert lines[1].startswith("back in the route plan: leaf-0a~spine-a-0 (plan p-")
    back = plans.current()
    assert back is not None and back.down == () and back.id != kept.id
    link = cluster.state.components.component("link", "leaf-0a~spine-a-0")
    assert link is not None and link.state == "healthy"
    release = [a for a in cluster.wait_actions(5) if a.action == "release"]
    assert [(a.target, a.detail["plan"]) for a in release] == [("leaf-0a~spine-a-0", back.id)]


def test_restart_limit_and_rate_limit_are_recorded_reasons(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    cluster.spares("node-012")
    limits = {"max_restarts": 0, "cluster_rate": {"actions": 1, "window_s": 600}}
    with worker(cluster, config(receiver, policy=limits)):
        cluster.job("job-6", JOB_NODES)
        cluster.send("diagnosis", diagnosis("d-9", "job-6", [("gpu", "node-009/gpu1", 0.9)]))
        cluster.wait_actions(3)
        cluster.send("diagnosis", diagnosis("d-10", "job-6", [("gpu", "node-010/gpu0", 0.9)]))
        actions = {(a.diagnosis, a.action): a for a in cluster.wait_actions(6)}

    assert actions[("d-9", "isolate")].status == "done"
    restart = actions[("d-9", "restart")]
    assert (restart.status, restart.detail["reason"]) == ("failed", "restart_limit")
    assert "giving up" in str(restart.detail["message"])
    alert = receiver.at("/alert")[0].json()["alerts"][0]
    assert alert["labels"]["severity"] == "critical"
    assert "restart_limit" in alert["annotations"]["actions"]
    isolate = actions[("d-10", "isolate")]
    assert (isolate.status, isolate.detail["reason"]) == ("skipped", "rate_limited")
    node = cluster.state.components.component("node", "node-010")
    assert node is not None
    assert node.state == "healthy"
    assert cluster.state.snapshot()["spares"] == ["node-012"]


def test_member_reports_on_the_job_topic_are_left_to_the_streams_worker(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    member = {
        "v": 1,
        "kind": "member",
        "job": "job-9",
        "ts_ns": 5,
        "rank": 0,
        "world_size": 2,
        "node": "node-001",
    }
    with worker(cluster, config(receiver)) as metrics:
        cluster.send("job", member, key="job-9")
        cluster.job("job-9", ["node-001", "node-002"])  # the placement after it is recorded
        assert metrics.jobs.labels("member")._value.get() == 1
    assert cluster.messages("deadletter") == []

"""kill -9 of the worker between taking a spare and publishing: resumed, not redone."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml

from actions.worker import CRASH_ENV
from schemas.codec import decode
from schemas.messages import Job
from tests.integration.actions_harness import (
    Cluster,
    HttpReceiver,
    WorkerProcess,
    config,
    diagnosis,
)

pytestmark = pytest.mark.integration


def test_killed_between_allocation_and_publication_ends_with_one_replacement(
    cluster: Cluster, tmp_path: Path
) -> None:
    receiver = HttpReceiver()
    config_path = tmp_path / "worker.yaml"
    config_path.write_text(yaml.safe_dump(config(receiver, claim_lease_s=1)))
    cluster.spares("node-011", "node-012", "node-013")
    log = tmp_path / "worker.log"
    doomed = WorkerProcess(cluster, config_path, log, **{CRASH_ENV: "restart_allocated"})
    try:
        cluster.job("job-11", ["node-008", "node-009", "node-010"])
        cluster.send("diagnosis", diagnosis("d-k", "job-11", [("gpu", "node-009/gpu1", 0.95)]))
        assert doomed.process.wait(60) == -signal.SIGKILL, doomed.log()
    finally:
        doomed.stop()
    # Killed right after the allocation script: spares taken and recorded, nothing published.
    taken = [
        n
        for n in ("node-011", "node-012", "node-013")
        if n not in cluster.state.snapshot()["spares"]
    ]
    assert len(taken) == 1
    last = decode(cluster.messages("job")[-1], "job")
    assert isinstance(last, Job)
    assert last.state == "running"
    assert cluster.actions() == []

    survivor = WorkerProcess(cluster, config_path, log)
    try:
        actions = cluster.wait_actions(3, timeout_s=60)
    finally:
        survivor.stop()
        receiver.close()
    assert sorted((a.action, a.status) for a in actions) == [
        ("alert", "done"),
        ("isolate", "done"),
        ("restart", "done"),
    ], survivor.log()
    restart = next(a for a in actions if a.action == "restart")
    assert restart.detail["replaced"] == {"node-009": taken[0]}
    state = cluster.state
    snapshot = state.snapshot()
    assert sorted(snapshot["spares"] + taken) == ["node-011", "node-012", "node-013"]
    placement = state.jobs.placement("job-11")
    assert placement is not None
    assert sorted({p.node for p in placement.values()}) == sorted(
        ["node-008", "node-010", taken[0]]
    )
    assert state.jobs.info("job-11")["restarts"] == "1"
    allocated = state.components.component("node", taken[0])
    assert allocated is not None
    assert allocated.state == "healthy"
    jobs = [decode(v, "job") for v in cluster.messages("job")]
    published = [j for j in jobs if isinstance(j, Job) and j.state == "restarting"]
    assert len(published) == 1
    assert {p.node for p in published[0].ranks} == {"node-008", "node-010", taken[0]}
    assert len(receiver.at("/launch")) == 1
    allocations = [e for e in state.audit.entries() if e["action"] == "allocate"]
    assert len(allocations) == 1

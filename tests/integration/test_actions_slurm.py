"""The action worker drives a real Slurm cluster: drain, requeue, release, spares.

A Slurm job (``sbatch --requeue``) stands for the training job; its placement is in the
cluster state as the streams worker would have assembled it. A diagnosis naming a GPU of
one of its nodes drains that node with c4's reason and requeues the job once, off the node.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from actions.drivers.slurm.cli import CommandRunner, Slurm
from actions.worker import CRASH_ENV
from c4.settings import Settings
from c4.stack.slurm import slurm_conf_path
from tests.integration.actions_harness import (
    Cluster,
    WorkerProcess,
    diagnosis,
    state_release,
    wait_for,
)
from tests.integration.test_slurm import clean as clean  # noqa: F401 - the fixture
from tests.integration.test_slurm import run, submit, wait_job  # noqa: F401
from tests.integration.test_slurm import settings as settings

pytestmark = pytest.mark.integration


def slurm_config(settings: Settings, **scheduler: Any) -> dict[str, Any]:
    return {
        "retry": {"tries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2},
        "claim_lease_s": 2,
        "policy": {"classes": {"noncomm_hang": ["isolate", "restart"]}},
        "scheduler": {
            "kind": "slurm",
            "slurm_conf": str(slurm_conf_path(settings)),
            "retry": {"tries": 3, "backoff_s": 0.1, "max_backoff_s": 0.5},
            "mirror_spares_s": 0.5,
        }
        | scheduler,
    }


def start_job(cluster: Cluster, settings: Settings, tmp_path: Path) -> tuple[str, list[str]]:
    driver = Slurm(CommandRunner(str(slurm_conf_path(settings))))
    job = submit(settings, tmp_path)
    nodes = driver.expand(wait_job(driver, job, "RUNNING").nodes)
    cluster.job(job, nodes)
    return job, nodes


def now_ns() -> int:
    """A finding's onset while the job runs (one from before its run requeues nothing)."""
    return time.time_ns()


def test_a_hang_drains_the_node_and_requeues_the_job_off_it(
    cluster: Cluster, clean: Settings, tmp_path: Path
) -> None:
    driver = Slurm(CommandRunner(str(slurm_conf_path(clean))))
    config_path = tmp_path / "worker.yaml"
    config_path.write_text(yaml.safe_dump(slurm_config(clean)))
    worker = WorkerProcess(cluster, config_path, tmp_path / "worker.log")
    try:
        job, nodes = start_job(cluster, clean, tmp_path)
        bad = nodes[1]
        cluster.send(
            "diagnosis",
            diagnosis("d-s1", job, [("gpu", f"{bad}/gpu1", 0.95)], onset_ns=now_ns()),
            job,
        )
        actions = cluster.wait_actions(2, timeout_s=60)
    finally:
        worker.stop()
    assert sorted((a.action, a.status) for a in actions) == [
        ("isolate", "done"),
        ("restart", "done"),
    ], worker.log()
    node = driver.node(bad)
    # A hang isolates the whole node of the GPU it names (the policy), drained for it.
    assert node.drained and node.reason == f"c4:d-s1 noncomm_hang {bad}"
    again = wait_job(driver, job, "RUNNING")
    assert again.restarts == 1 and bad not in driver.expand(again.nodes)


def test_a_finding_of_the_run_before_the_requeue_drains_nothing_after_a_release(
    cluster: Cluster, clean: Settings, tmp_path: Path
) -> None:
    # One fault, two findings: the second from the last reports of the run the first one's
    # requeue replaced (same stopped ranks, an onset before the requeue). The node was given
    # back in between; the second finding must not drain it again.
    driver = Slurm(CommandRunner(str(slurm_conf_path(clean))))
    config_path = tmp_path / "worker.yaml"
    config_path.write_text(yaml.safe_dump(slurm_config(clean)))
    worker = WorkerProcess(cluster, config_path, tmp_path / "worker.log")
    try:
        job, nodes = start_job(cluster, clean, tmp_path)
        bad, onset = nodes[1], now_ns()
        suspects = [("gpu", f"{bad}/gpu1", 0.95)]
        cluster.send("diagnosis", diagnosis("d-s4", job, suspects, onset_ns=onset), job)
        cluster.wait_actions(2, timeout_s=60)
        wait_job(driver, job, "RUNNING")
        released = state_release(cluster, config_path, bad)
        assert released.returncode == 0, released.stderr
        assert not driver.node(bad).drained
        # SubmitTime is whole seconds: an onset well before the requeue.
        late = diagnosis("d-s4b", job, suspects, onset_ns=onset - 2_000_000_000)
        cluster.send("diagnosis", late, job)
        actions = cluster.wait_actions(4, timeout_s=60)
    finally:
        worker.stop()
    second = {a.action: a for a in actions if a.diagnosis == "d-s4b"}
    assert {name: (a.status, a.detail.get("reason")) for name, a in second.items()} == {
        "isolate": ("skipped", "earlier_run"),
        "restart": ("skipped", "earlier_run"),
    }, worker.log()
    assert not driver.node(bad).drained  # still in service
    assert driver.job(job).restarts == 1  # requeued once, for the first finding


@pytest.mark.parametrize("crash_at", ["slurm_drained", "slurm_requeued"])
def test_killed_between_drain_and_requeue_still_one_drain_and_one_requeue(
    cluster: Cluster, clean: Settings, tmp_path: Path, crash_at: str
) -> None:
    driver = Slurm(CommandRunner(str(slurm_conf_path(clean))))
    config_path = tmp_path / "worker.yaml"
    config_path.write_text(yaml.safe_dump(slurm_config(clean)))
    log = tmp_path / "worker.log"
    doomed = WorkerProcess(cluster, config_path, log, **{CRASH_ENV: crash_at})
    try:
        job, nodes = start_job(cluster, clean, tmp_path)
        bad = nodes[0]
        cluster.send(
            "diagnosis", diagnosis("d-s2", job, [("node", bad, 0.9)], onset_ns=now_ns()), job
        )
        assert doomed.process.wait(60) == -signal.SIGKILL, doomed.log()
    finally:
        doomed.stop()
    # Killed after the drain (not requeued yet) or after the requeue (not recorded yet).
    assert driver.job(job).restarts == (1 if crash_at == "slurm_requeued" else 0)
    survivor = WorkerProcess(cluster, config_path, log)
    try:
        actions = cluster.wait_actions(2, timeout_s=60)
    finally:
        survivor.stop()
    restart = next(a for a in actions if a.action == "restart")
    expected = "already" if crash_at == "slurm_requeued" else "done"
    assert restart.status == "done" and restart.detail["slurm"] == expected, survivor.log()
    isolate = next(a for a in actions if a.action == "isolate")
    # Killed right after the drain: the survivor finds it drained; after the requeue, the
    # isolate step was recorded already and is resumed from the claim as it was.
    drained = "already" if crash_at == "slurm_drained" else "done"
    assert isolate.status == "done" and isolate.detail["slurm"] == drained
    again = wait_job(driver, job, "RUNNING")  # the hold lifted by the survivor
    assert again.restarts == 1 and bad not in driver.expand(again.nodes)
    drains = run(clean, "sinfo", "-R", "-h", "-o", "%N|%E").splitlines()
    assert drains == [f"{bad}|c4:d-s2 noncomm_hang {bad}"]


def test_release_resumes_c4s_drain_but_never_a_persons(
    cluster: Cluster, clean: Settings, tmp_path: Path
) -> None:
    driver = Slurm(CommandRunner(str(slurm_conf_path(clean))))
    config_path = tmp_path / "worker.yaml"
    config_path.write_text(yaml.safe_dump(slurm_config(clean, exclude_failed_nodes=False)))
    worker = WorkerProcess(cluster, config_path, tmp_path / "worker.log")
    try:
        cluster.send("diagnosis", diagnosis("d-r1", None, [("node", "node-002", 0.9)]))
        cluster.send("diagnosis", diagnosis("d-r2", None, [("node", "node-003", 0.9)]))
        cluster.wait_actions(2, timeout_s=60)
    finally:
        worker.stop()
    assert driver.node("node-002").drained_by_c4 and driver.node("node-003").drained_by_c4
    # A person takes node-003 over for a disk check: their reason replaces c4's.
    run(clean, "scontrol", "update", "NodeName=node-003", "State=DRAIN", "Reason=disk check")
    mine = state_release(cluster, config_path, "node-002")
    assert mine.returncode == 0, mine.stderr
    assert "slurm: node-002 resumed" in mine.stdout
    theirs = state_release(cluster, config_path, "node-003")
    assert theirs.returncode == 0, theirs.stderr
    assert "slurm: node-003 left drained: a person drained it" in theirs.stdout
    assert not driver.node("node-002").drained
    held = driver.node("node-003")
    assert held.drained and held.reason == "disk check"


def test_the_spare_pool_mirrors_slurms_idle_nodes(
    cluster: Cluster, clean: Settings, tmp_path: Path
) -> None:
    config_path = tmp_path / "worker.yaml"
    config_path.write_text(yaml.safe_dump(slurm_config(clean)))
    worker = WorkerProcess(cluster, config_path, tmp_path / "worker.log")
    try:
        wait_for(
            lambda: (
                cluster.state.components.spares()
                == ["node-000", "node-001", "node-002", "node-003"]
            ),
            what="the four idle Slurm nodes in the spare pool",
        )
        job = submit(clean, tmp_path, nodes=1)
        driver = Slurm(CommandRunner(str(slurm_conf_path(clean))))
        (busy,) = driver.expand(wait_job(driver, job, "RUNNING").nodes)
        wait_for(
            lambda: busy not in cluster.state.components.spares(),
            what=f"{busy} out of the spare pool once a job runs on it",
        )
        time.sleep(0.1)
        assert len(cluster.state.components.spares()) == 3
    finally:
        worker.stop()

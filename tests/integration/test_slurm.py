"""The Slurm driver on a real local Slurm cluster (munged, slurmctld, four slurmds).

The cluster is the stack's own (`c4.stack.slurm`, the ``slurm_stack`` fixture).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions.drivers.slurm.cli import Answer, CommandRunner, JobInfo, Slurm, drain_reason
from c4.settings import Settings
from c4.stack.slurm import (
    munge_dir,
    slurm_conf_path,
    slurm_down,
    slurm_env,
    slurm_status,
    slurm_up,
)


@pytest.fixture(scope="module")
def settings(slurm_stack: Settings) -> Settings:
    """The session's Slurm cluster."""
    return slurm_stack


def run(settings: Settings, *argv: str) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=dict(os.environ) | slurm_env(settings),
        timeout=30,
        check=True,
    )
    return done.stdout


def slurm(settings: Settings, *, dry_run: bool = False) -> Slurm:
    return Slurm(CommandRunner(str(slurm_conf_path(settings))), dry_run=dry_run)


def submit(settings: Settings, tmp_path: Path, nodes: int = 2) -> str:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N {nodes}\n#SBATCH --requeue\n#SBATCH -o {tmp_path}/job-%j.out\n"
        "srun sleep 300\n",
        encoding="utf-8",
    )
    return run(settings, "sbatch", "--parsable", str(script)).strip()


def wait_job(driver: Slurm, job: str, state: str, timeout_s: float = 60) -> JobInfo:
    deadline = time.monotonic() + timeout_s
    while True:
        info = driver.job(job)
        if info.state == state:
            return info
        assert time.monotonic() < deadline, f"job {job} stayed {info.state}"
        time.sleep(0.3)


@pytest.fixture
def clean(settings: Settings) -> Iterator[Settings]:
    """Every test leaves the cluster as it found it: no job, no drain."""
    yield settings
    run(settings, "scancel", "--full", "--user=root")
    driver = slurm(settings)
    for node in ("node-000", "node-001", "node-002", "node-003"):
        if driver.node(node).drained:
            run(settings, "scontrol", "update", f"NodeName={node}", "State=RESUME")


def test_a_drain_carries_c4s_reason_once_and_is_resumed(clean: Settings) -> None:
    driver = slurm(clean)
    reason = drain_reason("d-5c1e", "noncomm_hang", "node-001/gpu3")
    assert driver.drain("node-001", reason) is Answer.DONE
    assert driver.drain("node-001", reason) is Answer.ALREADY
    listed = run(clean, "sinfo", "-R", "-h", "-o", "%N|%E")
    assert "node-001|c4:d-5c1e noncomm_hang node-001/gpu3" in listed.splitlines()
    assert "node-001" not in driver.idle_nodes()
    assert driver.resume("node-001") is Answer.DONE
    assert driver.resume("node-001") is Answer.NOT_DRAINED
    assert driver.node("node-001").state.rstrip("*") == "idle"  # "*": until its next ping
    assert driver.idle_nodes() == ["node-000", "node-001", "node-002", "node-003"]


def test_a_node_a_person_drained_is_never_resumed_or_relabelled(clean: Settings) -> None:
    driver = slurm(clean)
    run(clean, "scontrol", "update", "NodeName=node-002", "State=DRAIN", "Reason=disk check")
    assert driver.drain("node-002", drain_reason("d-1", "gpu_fault", "node-002/gpu0")) is (
        Answer.HELD
    )
    assert driver.resume("node-002") is Answer.HELD
    node = driver.node("node-002")
    assert node.drained and node.reason == "disk check"


def test_a_job_is_requeued_once_and_placed_off_the_drained_node(
    clean: Settings, tmp_path: Path
) -> None:
    driver = slurm(clean)
    job = submit(clean, tmp_path)
    first = wait_job(driver, job, "RUNNING")
    bad = driver.expand(first.nodes)[0]
    assert driver.drain(bad, drain_reason("d-77", "noncomm_hang", bad)) is Answer.DONE
    assert driver.requeue(job, "d-77", exclude=[bad]) is Answer.DONE
    again = wait_job(driver, job, "RUNNING")  # no two-minute begin-time hold
    assert again.restarts == 1 and bad not in driver.expand(again.nodes)
    assert bad in driver.expand(again.excluded)
    assert driver.requeue(job, "d-77", exclude=[bad]) is Answer.ALREADY
    assert driver.job(job).restarts == 1


def test_a_crash_after_the_mark_still_requeues_exactly_once(
    clean: Settings, tmp_path: Path
) -> None:
    driver = slurm(clean)
    job = submit(clean, tmp_path, nodes=1)
    wait_job(driver, job, "RUNNING")
    # The worker wrote its mark and died before the requeue: the retry requeues.
    run(clean, "scontrol", "update", f"JobId={job}", "AdminComment=c4:requeue=d-9@0")
    assert driver.requeue(job, "d-9") is Answer.DONE
    assert wait_job(driver, job, "RUNNING").restarts == 1
    # The worker requeued and died before lifting the hold: the retry only lifts it.
    run(clean, "scontrol", "update", f"JobId={job}", "AdminComment=c4:requeue=d-10@1")
    run(clean, "scontrol", "requeue", job)
    assert driver.requeue(job, "d-10") is Answer.ALREADY
    assert wait_job(driver, job, "RUNNING").restarts == 2


def test_a_dry_run_prints_the_commands_and_changes_nothing(
    clean: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = slurm(clean, dry_run=True)
    assert driver.drain("node-003", drain_reason("d-2", "gpu_fault", "node-003/gpu1")) is (
        Answer.DONE
    )
    printed = capsys.readouterr().out
    assert printed == (
        "scontrol update NodeName=node-003 State=DRAIN 'Reason=c4:d-2 gpu_fault node-003/gpu1'\n"
    )
    assert not driver.node("node-003").drained


def test_an_unknown_node_or_job_is_a_clear_error(clean: Settings) -> None:
    driver = slurm(clean)
    with pytest.raises(Exception, match="node 'node-999' is not in Slurm's node list"):
        driver.node("node-999")
    with pytest.raises(Exception, match="Invalid job id") as raised:
        driver.job("999999")
    assert getattr(raised.value, "retryable", None) is False


def test_stack_status_lists_the_slurm_cluster_and_down_stops_it(tmp_path: Path) -> None:
    # A cluster of its own (two nodes, other ports), run by the stack's command line.
    env = {
        **os.environ,
        "C4_STACK_DIR": str(tmp_path / "stack"),
        "C4_STACK_SLURM_PORT": "17917",
        "C4_STACK_SLURM_NODES": "2",
        # Ports no Kafka or Redis of this stack folder listens on: down finds them stopped.
        "C4_STACK_KAFKA_PORT": "19992",
        "C4_STACK_CONTROLLER_PORT": "19993",
        "C4_STACK_REDIS_PORT": "19994",
    }
    own = Settings(stack_dir=tmp_path / "stack", stack_slurm_port=17917, stack_slurm_nodes=2)
    slurm_up(own)
    c4 = [sys.executable, "-m", "c4.cli", "stack"]
    try:
        status = subprocess.run(
            [*c4, "status"], capture_output=True, text=True, env=env, timeout=60
        )
        assert status.returncode == 3, status.stderr  # no Kafka or Redis here: "not running"
        rows = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()}
        assert rows["slurmctld"] == rows["slurmd-node-001"] == rows["munged"] == "running"
    except BaseException:
        slurm_down(own)  # a failure here must not leave a cluster on the test's ports
        raise
    down = subprocess.run(
        [*c4, "down"], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert "slurmctld stopped" in down.stdout
    assert all(s.state == "stopped" for s in slurm_status(own))
    assert not munge_dir(own).exists()  # munged's key and socket folder, outside the stack

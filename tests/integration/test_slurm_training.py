"""End to end on a real Slurm cluster: an unmodified PyTorch job watched, a fault found, the
node drained, the job requeued off it and completed.

The job (`c4/demo/slurm_train.py`, the one `c4 demo --slurm` runs: DDP over gloo, real
gradients, one task per node on 3 of the 4 nodes) is submitted with ``sbatch --requeue``;
each task runs as ``srun c4 run -- python slurm_train.py``. A node agent per node publishes
what the instrumentation hands it (member reports and collective messages), the streams
worker assembles the placement and detects, the action worker drives Slurm. Faults are
real: every rank of one node stopped with SIGSTOP (the others block in their allreduce), or
one rank throttled by a SIGSTOP/SIGCONT duty cycle (a straggler).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from actions.drivers.slurm.cli import CommandRunner, JobInfo, Slurm
from c4.demo.slurm_job import TRAINING_SCRIPT
from c4.settings import Settings
from c4.stack.slurm import slurm_conf_path, slurm_env
from schemas.codec import decode
from schemas.messages import Diagnosis, Job
from tests.integration.actions_harness import REPO, Cluster, wait_for
from tests.integration.test_slurm import clean as clean  # noqa: F401 - the fixture
from tests.integration.test_slurm import settings as settings  # noqa: F401 - the fixture
from tests.integration.test_slurm import wait_job

pytestmark = pytest.mark.integration

TRAIN = TRAINING_SCRIPT
NODES = ("node-000", "node-001", "node-002", "node-003")
VENV_BIN = Path(sys.executable).parent


# That the training script imports nothing of c4: tests/unit/test_demo_slurm.py.


class Process:
    """One long-running c4 process of the test, its log kept for failures."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                args, cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@contextmanager
def watched_cluster(
    cluster: Cluster, settings: Settings, tmp_path: Path, classes: dict[str, list[str]]
) -> Iterator[dict[str, Process]]:
    """Node agents, the streams worker and the action worker, live on the test's topics."""
    env = {
        **os.environ,
        **cluster.env(),
        **slurm_env(settings),
        "PYTHONPATH": str(REPO),
        "C4_TOPIC_PARTITIONS": "1",
        "C4_STACK_DIR": str(tmp_path / "stack"),
        "C4_STREAMS_APP_ID": f"test-{cluster.unique}",
        "C4_STREAMS_METRICS_PORT": "0",
    }
    config = tmp_path / "actions.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "retry": {"tries": 3, "backoff_s": 0.1, "max_backoff_s": 0.5},
                "policy": {"classes": classes},
                "scheduler": {
                    "kind": "slurm",
                    "slurm_conf": str(slurm_conf_path(settings)),
                    "mirror_spares_s": 2,
                },
            }
        )
    )
    c4 = [sys.executable, "-m", "c4.cli"]
    with ExitStack() as stack:
        running: dict[str, Process] = {}

        def start(name: str, args: list[str]) -> None:
            running[name] = Process(args, env, tmp_path / f"{name}.log")
            stack.callback(running[name].stop)

        start("streams", [*c4, "streams", "worker", "--app-id", f"test-{cluster.unique}"])
        start(
            "actions",
            [*c4, "actions", "worker", "--config", str(config), "--group", cluster.unique],
        )
        for node in NODES:
            folder = tmp_path / "handoff" / node
            folder.mkdir(parents=True)
            start(
                f"agent-{node}",
                [
                    *c4,
                    "agent",
                    "--node",
                    node,
                    "--handoff",
                    str(folder),
                    "--spool-dir",
                    str(tmp_path / "spool" / node),
                    "--no-sysfs",
                    "--no-nvml",
                    "--interval",
                    "0.5",
                ],
            )
        yield running


def submit_training(settings: Settings, tmp_path: Path, steps: int) -> str:
    out = tmp_path / "train"
    out.mkdir(exist_ok=True)
    script = tmp_path / "train.sh"
    handoff = tmp_path / "handoff"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N 3\n#SBATCH --ntasks-per-node=1\n#SBATCH --requeue\n"
        f"#SBATCH -o {tmp_path}/job-%j.out\n"
        # One handoff folder per node, as each real node has its own.
        f"srun bash -c 'C4_HANDOFF_DIR={handoff}/$SLURMD_NODENAME exec {VENV_BIN}/c4 run -- "
        f"{sys.executable} {TRAIN} {out} {steps}'\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        ["sbatch", "--parsable", str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, **slurm_env(settings)},
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def rank_on(tmp_path: Path, restart: int, node: str) -> tuple[int, int]:
    """The (global rank, pid) of the rank that runs on ``node`` in run ``restart``."""
    for path in (tmp_path / "train" / "pids").glob(f"r{restart}.rank*"):
        pid, where = path.read_text().split()
        if where == node:
            return int(path.name.rsplit("rank", 1)[1]), int(pid)
    message = f"no rank on {node} in run {restart}"
    raise AssertionError(message)


def rerun(slurm: Slurm, job: str) -> JobInfo | None:
    info = slurm.job(job)
    return info if info.state == "RUNNING" and info.restarts > 0 else None


def read_all(cluster: Cluster, kind: str) -> list[Any]:
    return [decode(value, kind) for value in cluster.messages(kind)]


@contextmanager
def explained(
    cluster: Cluster, slurm: Slurm, job: str, tmp_path: Path, running: dict[str, Process]
) -> Iterator[None]:
    """On a failure, say what the job, the findings, the training and the workers did."""
    try:
        yield
    except AssertionError as failure:
        info = slurm.job(job)
        findings = [
            f"{d.class_} {d.state} {[s.id for s in d.suspects]} onset {d.onset_ns / 1e9:.1f}"
            f" at {d.ts_ns / 1e9:.1f} {d.evidence}"
            for d in read_all(cluster, "diagnosis")
            if isinstance(d, Diagnosis)
        ]
        placements = [
            f"{j.ts_ns / 1e9:.1f} {j.state}: {sorted({r.node for r in j.ranks})}"
            for j in read_all(cluster, "job")
            if isinstance(j, Job) and j.job == job
        ]
        progress = sorted(
            f"{p.name}={p.read_text().strip()}" for p in (tmp_path / "train").glob("*.r*")
        )
        outputs = "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(tmp_path.glob("job-*.out"))
        )
        logs = "".join(
            f"\n--- {name}\n{running[name].tail()[-1500:]}" for name in ("streams", "actions")
        )
        context = (
            f"{failure}\njob {job}: {info.state} restarts={info.restarts} nodes={info.nodes}"
            f"\nfindings: {findings}\nplacements: {placements}\ntraining: {progress}{outputs}{logs}"
        )
        raise AssertionError(context) from failure


def test_a_stopped_node_is_drained_and_the_job_completes_off_it(
    cluster: Cluster, clean: Settings, tmp_path: Path
) -> None:
    slurm = Slurm(CommandRunner(str(slurm_conf_path(clean))))
    hard = ["isolate", "restart"]
    with watched_cluster(
        cluster, clean, tmp_path, {"noncomm_hang": hard, "node_down": hard}
    ) as running:
        job = submit_training(clean, tmp_path, steps=500)
        first = wait_job(slurm, job, "RUNNING")
        nodes = slurm.expand(first.nodes)
        # The placement comes from the ranks' own reports, through the agents and streams.
        placed = wait_for(lambda: cluster.state.jobs.placement(job), 90, f"placement of job {job}")
        assert {place.node for place in placed.values()} == set(nodes)
        wait_for(lambda: (tmp_path / "train" / "progress.r0").exists(), 60, "training steps")
        bad = nodes[1]
        stopped_at = time.time()
        stopped_rank, pid = rank_on(tmp_path, 0, bad)
        os.kill(pid, signal.SIGSTOP)
        with explained(cluster, slurm, job, tmp_path, running):
            wait_for(lambda: slurm.node(bad).drained, 90, f"{bad} drained")
            drained_at = time.time()
            # The drain comes first, the requeue a moment later: wait for the rerun itself.
            again = wait_for(lambda: rerun(slurm, job), 90, f"job {job} running again")
            assert again.restarts == 1 and bad not in slurm.expand(again.nodes)
            wait_for(lambda: (tmp_path / "train" / "done.r1").exists(), 180, "the rerun completed")
            # Once: the stopped run's last findings (a hang of its waiting ranks) arrive after
            # the requeue and must not requeue the healthy rerun.
            assert wait_job(slurm, job, "COMPLETED", timeout_s=60).restarts == 1
    # Every rank of the node stopped, their reporting threads too, while the node's agent
    # went on saying the node is up: a hang naming the stopped rank, not the node down.
    found = [
        d
        for d in read_all(cluster, "diagnosis")
        if isinstance(d, Diagnosis)
        and d.state == "firing"
        and d.job == job
        and d.class_ in ("node_down", "noncomm_hang")
    ]
    assert [d.class_ for d in found[:1]] == ["noncomm_hang"], found
    # Named as missing from the next operation, or as silent inside the one it was in. A
    # healthy rank still waiting for the stopped one in the operation before is missing from
    # the next one too (gloo's ring lets them finish at different times): it is a waiter, so
    # the stopped rank alone is the suspect.
    named = found[0].evidence.get("missing_ranks") or found[0].evidence.get("silent_ranks")
    assert stopped_rank in named, found
    assert found[0].evidence["suspect_global_ranks"] == [stopped_rank], found
    assert found and found[0].suspects[0].id.split("/")[0] == bad, found
    node = slurm.node(bad)
    assert node.reason.startswith(f"c4:{found[0].id} noncomm_hang {bad}"), node.reason
    placements = [j for j in read_all(cluster, "job") if isinstance(j, Job) and j.job == job]
    # Two placements assembled from member reports: the first run's, the rerun's off `bad`.
    assert {p.node for p in placements[-1].ranks} == set(slurm.expand(again.nodes))
    print(f"hang to drain: {drained_at - stopped_at:.1f} s")


def test_a_throttled_rank_is_named_as_the_straggler(
    cluster: Cluster, clean: Settings, tmp_path: Path
) -> None:
    slurm = Slurm(CommandRunner(str(slurm_conf_path(clean))))
    with watched_cluster(cluster, clean, tmp_path, {"noncomm_slow": []}):
        job = submit_training(clean, tmp_path, steps=1500)
        nodes = slurm.expand(wait_job(slurm, job, "RUNNING").nodes)
        wait_for(lambda: (tmp_path / "train" / "progress.r0").exists(), 60, "training steps")
        slow = nodes[2]
        _, pid = rank_on(tmp_path, 0, slow)
        stop = threading.Event()

        def throttle() -> None:
            # A CPU quota in effect: the rank runs 70 ms of every 100.
            while not stop.is_set():
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.03)
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.07)

        throttler = threading.Thread(target=throttle, daemon=True)
        throttler.start()
        try:
            found = wait_for(
                lambda: [
                    d
                    for d in read_all(cluster, "diagnosis")
                    if isinstance(d, Diagnosis) and d.class_ == "noncomm_slow"
                ],
                90,
                "a straggler finding",
            )
        finally:
            stop.set()
            throttler.join(5)
            os.kill(pid, signal.SIGCONT)
    assert found[0].job == job
    assert found[0].suspects[0].id.startswith(slow), found[0]

"""``c4 state`` and ``c4 actions worker`` through the real entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from actions.state.model import TransitionRequest
from schemas.codec import encode
from schemas.messages import Job
from tests.integration.actions_harness import TOPOLOGY, Cluster, job_message
from tests.integration.workers import REPO

pytestmark = pytest.mark.integration


def c4(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args],
        env=dict(os.environ, PYTHONPATH=str(REPO), **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_state_commands_load_spare_show_and_release(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path
) -> None:
    cluster = Cluster(kafka_bootstrap, redis_url, unique)
    try:
        env = cluster.env()
        topology = tmp_path / "topology.json"
        topology.write_bytes(encode(TOPOLOGY))
        loaded = c4(env, "state", "load", "--topology", str(topology))
        assert loaded.returncode == 0, loaded.stderr
        assert "16 nodes, 128 gpus, 32 ports" in loaded.stdout

        spared = c4(env, "state", "spare", "node-014", "node-015", "node-99")
        assert spared.returncode == 1
        assert spared.stdout.splitlines() == [
            "node-014 spare",
            "node-015 spare",
            "node-99: unknown node 'node-99' (load the topology first: c4 state load)",
        ]
        placement = Job.model_validate(job_message("job-c", ["node-000", "node-001"]))
        assert cluster.state.jobs.record(placement)
        busy = c4(env, "state", "spare", "node-001")
        assert busy.stdout.strip() == "node-001: node-001 runs job-c: not a spare"

        now = 1_700_000_000_000_000_000
        assert (
            cluster.state.components.transition(
                TransitionRequest(
                    kind="node",
                    ident="node-001",
                    to="isolated",
                    action="isolate",
                    reason="test",
                    ts_ns=now,
                    now_ms=now // 10**6,
                    actor="test",
                    diagnosis="d-c",
                )
            ).outcome
            == "ok"
        )
        shown = c4(env, "state", "show")
        assert "node-001 isolated epoch 1 (test) [d-c]" in shown.stdout
        assert "spares: node-014, node-015" in shown.stdout
        assert "job job-c: running, 4 ranks on 2 nodes, 0 restarts" in shown.stdout
        data = orjson.loads(c4(env, "state", "show", "--json").stdout)
        assert data["components"]["node"]["counts"] == {
            "healthy": 13,
            "suspect": 0,
            "isolated": 1,
            "spare": 2,
        }

        released = c4(env, "state", "release", "node-001")
        assert released.returncode == 0, released.stderr
        assert released.stdout.strip() == "node node-001 released (epoch 2)"
        again = c4(env, "state", "release", "node-001")
        assert again.returncode == 1
        assert again.stderr.strip() == (
            "c4: error: node node-001 is healthy, not isolated or suspect"
        )
        audit = [orjson.loads(line) for line in c4(env, "state", "audit").stdout.splitlines()]
        assert [(e["action"], e["target"]) for e in audit][-1] == ("release", "node-001")
        # Waited for: on a broker just started, the checking consumer's group takes a while.
        records = cluster.wait_actions(1)
        assert [(r.action, r.target, r.status) for r in records] == [
            ("release", "node-001", "done")
        ]
    finally:
        cluster.close()


def test_worker_rejects_a_bad_configuration_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "worker.yaml"
    bad.write_text("policy:\n  classes:\n    node_down: [isolate, reboot]\n")
    started = c4({}, "actions", "worker", "--config", str(bad))
    assert started.returncode == 2
    assert started.stderr == (
        f"c4: error: {bad}: policy.classes.node_down: unknown action 'reboot'"
        " (known: alert, isolate, reroute, restart)\n"
    )
    bad.write_text(
        "receivers:\n  - name: x\n    url: http://127.0.0.1:1/\n    secret_env: NOT_SET_X\n"
    )
    started = c4({}, "actions", "worker", "--config", str(bad))
    assert started.returncode == 2
    assert started.stderr == (
        f"c4: error: {bad}: receivers[0].secret_env: environment variable NOT_SET_X is not set\n"
    )

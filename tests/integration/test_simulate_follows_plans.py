"""`c4 simulate --kafka --follow-plans`: the simulated fabric takes the plan in force in Redis,
as node agents applying their route messages would (the docker-compose agent runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis

from actions.drivers.reroute.plan_store import PlanStore
from planner.reroute import CurrentPlan
from schemas.codec import encode
from schemas.files import Plan, PlanPath
from simulator.cluster import build_cluster
from simulator.scenario import scenario_from
from topology.model import Fabric

pytestmark = pytest.mark.integration

SCENARIO = {
    "name": "follow",
    "seed": 3,
    "duration_s": 12,
    "fabric": {"nodes_per_leaf": 1, "spines": 4},
    "jobs": [{"id": "job-f", "ranks": 16, "compute_ms": 100}],
}


def test_the_simulated_fabric_takes_the_plan_in_force(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path
) -> None:
    scenario = scenario_from(SCENARIO)
    cluster = build_cluster(None, scenario)
    fabric = Fabric.from_topology(cluster.topology)
    (job,) = cluster.jobs
    comm = next(comm for comm in job.comms if comm.network())
    conn = comm.network()[0]  # node-000 to node-001: two leaves, a spine between
    assert conn.via is not None and conn.src_port is not None and conn.dst_port is not None
    flow = f"job-f/{comm.id}/{conn.src}->{conn.dst}"
    paths = fabric.paths(conn.src_port, conn.dst_port)
    moved = next(path for path in paths if path.via != conn.via)
    prefix = f"test-{unique}"
    client = redis.Redis.from_url(redis_url)
    plans = PlanStore(client, f"{prefix}:plan:")
    plan = Plan(
        v=1,
        kind="plan",
        paths=(PlanPath(flow=flow, via=moved.via, links=moved.links),),
        max_util=1.0,
    )
    plans.replace(CurrentPlan("p-follow", plan, (), time.time_ns()), None)
    (tmp_path / "scenario.json").write_bytes(orjson.dumps(SCENARIO))
    (tmp_path / "topology.json").write_bytes(encode(cluster.topology))
    env = dict(
        os.environ,
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        C4_TOPIC_PREFIX=f"test.{unique}.",
        C4_REDIS_URL=redis_url,
        C4_REDIS_KEY_PREFIX=prefix,
    )
    c4 = [sys.executable, "-m", "c4.cli"]
    try:
        created = subprocess.run(  # noqa: S603 -- this interpreter, our own command
            [*c4, "topics", "create"], env=env, capture_output=True, timeout=60, check=False
        )
        assert created.returncode == 0, created.stderr
        run = subprocess.run(  # noqa: S603 -- this interpreter, our own command
            [
                *c4,
                "simulate",
                "--scenario",
                str(tmp_path / "scenario.json"),
                "--topology",
                str(tmp_path / "topology.json"),
                "--kafka",
                "--follow-plans",
                "--start-now",
                "--speed",
                "6",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        client.delete(*client.keys(f"{prefix}:*") or ["-"])
        client.close()
    assert run.returncode == 0, run.stderr
    applied = [line for line in run.stderr.splitlines() if line.startswith("at ")]
    assert len(applied) == 1 and f" {flow} via {moved.via} " in applied[0], run.stderr
    assert "messages published to" in run.stderr

    bad = subprocess.run(  # noqa: S603 -- this interpreter, our own command
        [*c4, "simulate", "--scenario", str(tmp_path / "scenario.json"), "--follow-plans"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode != 0
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("needs --kafka and one record per message (no --batch)")
    )

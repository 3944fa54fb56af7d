"""Helpers of the fabric import tests: run ``c4``, and load a topology into Redis and plan on it
the way a deployment would (``c4 state load``, ``c4 plan``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import redis

from tests.integration.workers import REPO


def c4(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``c4 ARGS`` through the real entry point, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args],
        env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def accepted_by_state_and_plan(topology: Path, redis_url: str, unique: str) -> str:
    """Load the topology with ``c4 state load`` (under a key prefix of its own, deleted after)
    and plan one flow between its first and last port with ``c4 plan``; the load's output."""
    prefix = f"test:{unique}"
    try:
        loaded = c4(
            "state",
            "load",
            "--topology",
            str(topology),
            env={"C4_REDIS_URL": redis_url, "C4_REDIS_KEY_PREFIX": prefix},
        )
        assert loaded.returncode == 0, loaded.stderr
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    document = orjson.loads(topology.read_bytes())
    ports = [f"{node['id']}/{port['id']}" for node in document["nodes"] for port in node["ports"]]
    flows = topology.with_name("flows.json")
    flow = {"id": "f1", "src": ports[0], "dst": ports[-1], "gbps": 1.0}
    flows.write_bytes(orjson.dumps({"v": 1, "kind": "flows", "flows": [flow]}))
    planned = c4("plan", "--topology", str(topology), "--flows", str(flows))
    assert planned.returncode == 0, planned.stderr
    plan = orjson.loads(planned.stdout)
    assert [path["flow"] for path in plan["paths"]] == ["f1"]
    return loaded.stdout

"""``c4 demo`` end to end on a small scenario: real broker, Redis, workers and HTTP receivers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration

SCENARIO = {
    "name": "small-demo",
    "seed": 3,
    "duration_s": 30,
    "emit_routes": True,
    "jobs": [
        {"id": "job-a", "ranks": 32, "compute_ms": 150},
        {"id": "job-b", "ranks": 16, "compute_ms": 120},
    ],
    "faults": [
        {"type": "process_stuck", "job": "job-b", "rank": 9, "at_s": 8},
        {
            "type": "port_degraded",
            "node": "node-001",
            "port": "mlx5_2:1",
            "factor": 0.5,
            "at_s": 14,
        },
    ],
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_demo_diagnoses_and_acts_on_every_fault(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path
) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_bytes(orjson.dumps(SCENARIO))
    report = tmp_path / "report"
    env = dict(
        os.environ,
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        C4_REDIS_URL=redis_url,
        C4_TOPIC_PREFIX=f"test.{unique}.",
        C4_REDIS_KEY_PREFIX=f"test:{unique}",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "c4.cli",
            "demo",
            "--scenario",
            str(scenario),
            "--nodes",
            "8",
            "--spines",
            "2",
            "--report",
            str(report),
            "--no-dashboard",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert "PASS: 2/2 faults diagnosed, 2/2 acted on, 0 false findings" in out
    assert re.search(r"process_stuck +node-005/gpu1 +noncomm_hang +node-005/gpu1", out), out
    assert "restart job-b: node-005 -> node-006 (same leaf)" in out  # the first spare: same leaf
    # Its own names: this run's topics and keys, under the configured prefixes.
    assert f"topics: 8 under prefix test.{unique}.demo-" in out
    # Everything it started is gone.
    pids = [int(p) for p in re.findall(r"\(pid (\d+)", out)]
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    page = (report / "index.html").read_text(encoding="utf-8")
    assert "process_stuck" in page and "port_degraded" in page
    assert (report / "timeline.png").stat().st_size > 5_000

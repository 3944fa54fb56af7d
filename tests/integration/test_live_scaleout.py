"""Live detection on the real broker: every fault class, one worker and two sharing 8 partitions.

A simulated cluster with one fault of every kind is published in event time (10x real time);
the workers must conclude what the offline replay (`c4 diagnose`) concludes from the same
events: the same classes, jobs and suspects, each published once.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.integration.live_runs import (
    DiagnosisReader,
    PacedPublisher,
    SimulatedRun,
    findings,
    topic_env,
    wait_for_members,
)
from tests.integration.workers import FaustWorker

# Event seconds per wall second. Two workers share placements and port health through a
# global table, whose updates take a fraction of a wall second to reach the other worker:
# sped up that is seconds of event time, which a real cluster (1x) never sees: real time.
SPEED_ONE_WORKER = 5.0
SPEED_TWO_WORKERS = 1.0


def every_fault_class() -> dict[str, Any]:
    """Seven jobs; one fault each in five of them, two faults in job-d, and a degraded
    leaf~spine link that two healthy jobs (job-e, job-f) cross."""
    ranks = {"d": 24, "f": 24, "g": 24}
    return {
        "seed": 9,
        "duration_s": 50,
        "emit_routes": True,
        "fabric": {"nodes_per_leaf": 2, "spines": 2},
        "jobs": [
            {"id": f"job-{c}", "ranks": ranks.get(c, 16), "compute_ms": 120} for c in "abcdefg"
        ],
        "faults": [
            {"type": "slow_gpu", "job": "job-a", "rank": 5, "factor": 1.3, "at_s": 8},
            {"type": "gpu_stop", "job": "job-b", "rank": 3, "at_s": 20},
            {"type": "process_stuck", "job": "job-c", "rank": 9, "at_s": 25},
            {
                "type": "port_degraded",
                "node": "node-008",
                "port": "mlx5_2:1",
                "factor": 0.4,
                "at_s": 12,
            },
            {"type": "node_down", "node": "node-007", "at_s": 30},
            {"type": "link_down", "node": "node-015", "port": "mlx5_1:1", "at_s": 35},
            {
                "type": "fabric_link_degraded",
                "link": "leaf-5a~spine-a-0",
                "factor": 0.4,
                "at_s": 15,
            },
        ],
    }


@pytest.fixture(scope="module")
def run() -> SimulatedRun:
    simulated = SimulatedRun.of(every_fault_class())
    classes = {cls for cls, _, _ in findings(simulated.replay)}
    assert classes == {
        "noncomm_slow",
        "noncomm_hang",
        "comm_hang",
        "comm_slow",
        "node_down",
        "link_down",
        "link_degraded",
        "gpu_fault",
    }
    return simulated


def live_findings(
    run: SimulatedRun,
    bootstrap: str,
    unique: str,
    tmp_path: Path,
    workers: int,
    partitions: int,
    speed: float,
    extra_env: dict[str, str] | None = None,
) -> list[Any]:
    prefix = f"test.{unique}"
    env = topic_env(bootstrap, prefix, f"test-{unique}", partitions)
    env.update(extra_env or {})
    topology = tmp_path / "topology.json"
    topology.write_bytes(run.topology_json())
    env["C4_TEST_TOPOLOGY"] = str(topology)
    env["C4_TEST_CLOCK_RATE"] = str(speed)
    env["C4_TEST_DATADIR"] = str(tmp_path / "faust")
    expected = findings(run.replay)
    with ExitStack() as stack:
        running = [
            stack.enter_context(
                FaustWorker("tests.integration.detect_app", env, tmp_path / f"worker{i}.log")
            )
            for i in range(workers)
        ]

        def alive() -> None:
            for worker in running:
                worker.assert_alive()

        if workers > 1:
            # The partitions are shared out before the run, so that this test is about
            # several owners, not about a hand-over (test_live_restart.py covers that).
            wait_for_members(bootstrap, f"test-{unique}", workers, alive)
        reader = DiagnosisReader(bootstrap, f"{prefix}.diagnosis", f"check-{unique}")
        publisher = PacedPublisher(bootstrap, prefix, run.messages, speed)
        publisher.start()
        reader.until(lambda found: findings(found) >= expected, 120, alive)
        publisher.join(60)
        assert publisher.error is None
        # A little longer: a false finding would come after the expected ones.
        reader.until(lambda found: False, 3, alive)
        reader.close()
    return reader.found


def test_one_worker_finds_every_class_the_replay_finds(
    run: SimulatedRun, kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    found = live_findings(
        run, kafka_bootstrap, unique, tmp_path, workers=1, partitions=4, speed=SPEED_ONE_WORKER
    )
    assert findings(found) == findings(run.replay), [
        (d.ts_ns - run.messages[0].ts_ns, d.class_, d.job)
        for d in found  # type: ignore[attr-defined]
    ]
    keys = [(d.id, d.state) for d in found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice"


def test_two_workers_on_eight_partitions_find_what_one_finds(
    run: SimulatedRun, kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    found = live_findings(
        run, kafka_bootstrap, unique, tmp_path, workers=2, partitions=8, speed=SPEED_TWO_WORKERS
    )
    assert findings(found) == findings(run.replay)
    keys = [(d.id, d.state) for d in found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice"

"""kill -9 of the detection worker in the middle of a live run, then a restart.

The restarted worker takes its jobs' state over from the changelog-backed tables: the
straggler found before the kill is not published again, nothing false is raised while it
catches up, and the GPU that dies after the restart is still found.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

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

SPEED = 2.0
SCENARIO = {
    "seed": 4,
    "duration_s": 60,
    "emit_routes": True,
    "fabric": {"nodes_per_leaf": 2, "spines": 2},
    "jobs": [
        {"id": "job-a", "ranks": 16, "compute_ms": 120},
        {"id": "job-b", "ranks": 24, "compute_ms": 150},
    ],
    "faults": [
        {"type": "slow_gpu", "job": "job-a", "rank": 6, "factor": 1.3, "at_s": 6},
        {
            "type": "port_degraded",
            "node": "node-003",
            "port": "mlx5_2:1",
            "factor": 0.4,
            "at_s": 10,
        },
        {"type": "gpu_stop", "job": "job-b", "rank": 17, "at_s": 45},
    ],
}
KILL_AT_S = 20.0


@pytest.mark.parametrize("split", [False, True], ids=["one-stage", "split"])
def test_kill_9_and_restart_goes_on_from_the_tables(
    kafka_bootstrap: str, unique: str, tmp_path: Path, split: bool
) -> None:
    """Split (``--split``), the killed worker held the forwarder, the node stages and the
    job stage: the restarted one goes on from the job's and the node stages' tables."""
    run = SimulatedRun.of(SCENARIO)
    expected = findings(run.replay)
    assert {cls for cls, _, _ in expected} >= {"noncomm_slow", "link_degraded", "noncomm_hang"}
    prefix = f"test.{unique}"
    env = topic_env(kafka_bootstrap, prefix, f"test-{unique}", 4)
    env |= {
        "C4_TEST_CLOCK_RATE": str(SPEED),
        "C4_TEST_SESSION_TIMEOUT": "6",
        "C4_TEST_DATADIR": str(tmp_path / "faust"),
        "C4_TEST_SPLIT": "1" if split else "0",
    }
    topology = tmp_path / "topology.json"
    topology.write_bytes(run.topology_json())
    env["C4_TEST_TOPOLOGY"] = str(topology)
    start_ns = run.messages[0].ts_ns  # type: ignore[attr-defined]
    reader = DiagnosisReader(kafka_bootstrap, f"{prefix}.diagnosis", f"check-{unique}")
    publisher = PacedPublisher(kafka_bootstrap, prefix, run.messages, SPEED)

    with FaustWorker("tests.integration.detect_app", env, tmp_path / "first.log") as first:
        publisher.start()
        # Killed once the straggler is out (a loaded machine's worker runs seconds behind the
        # publisher): its state must be taken over, not relearnt.
        reader.until(
            lambda found: (
                publisher.published_ns > start_ns + KILL_AT_S * 1e9
                and ("noncomm_slow", "job-a") in {(d.class_, d.job) for d in found}
            ),
            120,
            first.assert_alive,
        )
        before = {(d.class_, d.job) for d in reader.found if d.state == "firing"}
        assert ("noncomm_slow", "job-a") in before, reader.found
        first.kill()
    killed = time.monotonic()

    with FaustWorker("tests.integration.detect_app", env, tmp_path / "second.log") as second:
        reader.until(lambda found: findings(found) >= expected, 150, second.assert_alive)
        publisher.join(120)
        assert publisher.error is None
        reader.until(lambda found: False, 3, second.assert_alive)  # nothing false comes late
    reader.close()
    print(f"restarted worker caught up; all findings in {time.monotonic() - killed:.1f} s")

    assert findings(reader.found) == expected
    keys = [(d.id, d.state) for d in reader.found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice across the restart"
    # Not named again under a new onset either: a worker that relearnt instead of taking its
    # state over would fire the open straggler a second time, with another id.
    fired = [(d.class_, d.job, tuple(s.id for s in d.suspects)) for d in reader.found]
    fired = [f for f, d in zip(fired, reader.found, strict=True) if d.state == "firing"]
    assert len(fired) == len(set(fired)), fired
    after_kill = [d for d in reader.found if d.ts_ns > start_ns + KILL_AT_S * 1e9]
    assert ("noncomm_hang", "job-b") in {(d.class_, d.job) for d in after_kill}


@pytest.mark.parametrize("killed", [0, 1])
def test_kill_9_of_one_of_two_split_workers_the_other_takes_its_stages_over(
    kafka_bootstrap: str, unique: str, tmp_path: Path, killed: int
) -> None:
    """Two split workers share 8 partitions; one is killed mid-run. The other takes its
    node stages over (restored, the partitions read again from their resume offsets) and,
    where the killed one held a job's partition, that job's stage: the findings are the
    replay's, nothing is published twice, the hang that starts after the kill is found.
    Killing each worker in turn covers both the job stage moving and staying."""
    run = SimulatedRun.of(SCENARIO)
    expected = findings(run.replay)
    prefix = f"test.{unique}"
    group = f"test-{unique}"
    env = topic_env(kafka_bootstrap, prefix, group, 8)
    env |= {
        "C4_TEST_CLOCK_RATE": "1",
        "C4_TEST_SESSION_TIMEOUT": "6",
        "C4_TEST_DATADIR": str(tmp_path / "faust"),
        "C4_TEST_SPLIT": "1",
    }
    topology = tmp_path / "topology.json"
    topology.write_bytes(run.topology_json())
    env["C4_TEST_TOPOLOGY"] = str(topology)
    start_ns = run.messages[0].ts_ns  # type: ignore[attr-defined]
    reader = DiagnosisReader(kafka_bootstrap, f"{prefix}.diagnosis", f"check-{unique}")
    publisher = PacedPublisher(kafka_bootstrap, prefix, run.messages, 1.0)

    with ExitStack() as stack:
        workers = [
            stack.enter_context(
                FaustWorker("tests.integration.detect_app", env, tmp_path / f"worker{i}.log")
            )
            for i in range(2)
        ]
        survivor = workers[1 - killed]

        def both_alive() -> None:
            for worker in workers:
                worker.assert_alive()

        wait_for_members(kafka_bootstrap, group, 2, both_alive)
        publisher.start()
        reader.until(
            lambda _: publisher.published_ns > start_ns + KILL_AT_S * 1e9,
            120,
            survivor.assert_alive,
        )
        workers[killed].kill()
        reader.until(lambda found: findings(found) >= expected, 150, survivor.assert_alive)
        publisher.join(120)
        assert publisher.error is None
        reader.until(lambda found: False, 3, survivor.assert_alive)  # nothing false comes late
    reader.close()

    assert findings(reader.found) == expected
    keys = [(d.id, d.state) for d in reader.found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice across the kill"
    after_kill = [d for d in reader.found if d.ts_ns > start_ns + KILL_AT_S * 1e9]
    assert ("noncomm_hang", "job-b") in {(d.class_, d.job) for d in after_kill}

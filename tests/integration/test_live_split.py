"""One job's detection spread over the workers on the real broker (``--split``): the
forwarder, node stages and job stage (`streams.split_app`) conclude what the replay
concludes, every class including the fabric-wide one, with one worker and with two
sharing the partitions."""

from __future__ import annotations

from pathlib import Path

from tests.integration.live_runs import SimulatedRun, findings
from tests.integration.test_live_scaleout import (
    SPEED_ONE_WORKER,
    SPEED_TWO_WORKERS,
    live_findings,
    run,
)

__all__ = ["run"]  # the module's simulated cluster, a fixture shared with the scale-out tests
SPLIT = {"C4_TEST_SPLIT": "1"}


def test_one_split_worker_finds_every_class_the_replay_finds(
    run: SimulatedRun, kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    found = live_findings(
        run,
        kafka_bootstrap,
        unique,
        tmp_path,
        workers=1,
        partitions=4,
        speed=SPEED_ONE_WORKER,
        extra_env=SPLIT,
    )
    assert findings(found) == findings(run.replay)
    keys = [(d.id, d.state) for d in found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice"


def test_two_split_workers_find_what_one_finds(
    run: SimulatedRun, kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    found = live_findings(
        run,
        kafka_bootstrap,
        unique,
        tmp_path,
        workers=2,
        partitions=8,
        speed=SPEED_TWO_WORKERS,
        extra_env=SPLIT,
    )
    assert findings(found) == findings(run.replay)
    keys = [(d.id, d.state) for d in found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice"

"""One job's detection spread over the workers on the real broker (``--split``): the
forwarder, node stages and job stage (`streams.split_app`) conclude what the replay
concludes, every class including the fabric-wide one, with one worker and with two
sharing the partitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.live_runs import SimulatedRun, findings
from tests.integration.test_live_scaleout import SPEED_TWO_WORKERS, live_findings, run

__all__ = ["run"]  # the module's simulated cluster, a fixture shared with the scale-out tests
SPLIT = {"C4_TEST_SPLIT": "1"}
# Real time, as a cluster runs. Split, a job's reports reach the job stage two topic hops
# later than the link reports that move its clock. Sped up 5x on a loaded machine (load 3.7
# on 2 cores), the fabric-wide finding was missed in 3 of 5 runs; at 1x it was found in
# every run. Not analysed further (docs/detection-split.md).
SPEED = SPEED_TWO_WORKERS


@pytest.mark.parametrize(("workers", "partitions"), [(1, 4), (2, 8)])
def test_split_workers_find_every_class_the_replay_finds(
    run: SimulatedRun,
    kafka_bootstrap: str,
    unique: str,
    tmp_path: Path,
    workers: int,
    partitions: int,
) -> None:
    found = live_findings(
        run,
        kafka_bootstrap,
        unique,
        tmp_path,
        workers=workers,
        partitions=partitions,
        speed=SPEED,
        extra_env=SPLIT,
    )
    assert findings(found) == findings(run.replay)
    keys = [(d.id, d.state) for d in found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice"

"""The usual Faust command line runs the detection app too: faust -A c4.faust_app worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.live_runs import DiagnosisReader, publish
from tests.integration.test_live_detection import KINDS
from tests.integration.workers import REPO, create_topics
from tests.unit.ring_job import RingJob


def test_faust_a_worker_finds_a_hang(kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    prefix = f"test.{unique}."
    create_topics(kafka_bootstrap, [f"{prefix}c4.{kind}.v1" for kind in KINDS], 4)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        C4_TOPIC_PREFIX=prefix,
        C4_TOPIC_PARTITIONS="4",
        C4_STACK_DIR=str(tmp_path / "stack"),
        C4_STREAMS_APP_ID=f"test-{unique}",
        C4_STREAMS_METRICS_PORT="0",
    )
    job = RingJob(stuck_rank={11: 40})
    with (tmp_path / "faust.log").open("wb") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "faust",
                "-A",
                "c4.faust_app",
                "worker",
                "-l",
                "warn",
                "--without-web",
            ],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        publish(
            kafka_bootstrap,
            lambda m: f"{prefix}c4.{m.kind}.v1",  # type: ignore[attr-defined]
            [job.job_message(), *job.messages()],
        )
        reader = DiagnosisReader(kafka_bootstrap, f"{prefix}c4.diagnosis.v1", f"check-{unique}")

        def alive() -> None:
            assert worker.poll() is None, (tmp_path / "faust.log").read_text()[-3000:]

        found = reader.until(lambda f: any(d.class_ == "noncomm_hang" for d in f), 90, alive)
        reader.close()
    finally:
        worker.terminate()
        worker.wait(30)
    hang = next(d for d in found if d.class_ == "noncomm_hang")
    assert hang.suspects[0].id == "node-001/gpu3"

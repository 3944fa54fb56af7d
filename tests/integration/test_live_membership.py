"""The live worker places a job from its ranks' own reports and publishes the placement."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer

from schemas.codec import decode
from schemas.messages import Job
from schemas.topics import TOPICS_BY_KIND
from tests.integration.live_runs import DiagnosisReader, publish
from tests.integration.test_live_detection import KINDS
from tests.integration.workers import FaustWorker, create_topics
from tests.unit.ring_job import RingJob
from tests.unit.test_membership import ring_members


def test_placement_from_member_reports_live(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    prefix = f"test.{unique}"
    create_topics(kafka_bootstrap, [f"{prefix}.{kind}" for kind in KINDS])
    job = RingJob(stuck_rank={11: 40})
    bare = [m.model_copy(update={"node": None, "gpu": None}) for m in job.messages()]
    env = {
        "C4_TEST_TOPIC_PREFIX": prefix,
        "C4_TEST_APP_ID": f"test-{unique}",
        "C4_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    with FaustWorker("tests.integration.detect_app", env, tmp_path / "worker.log") as worker:
        # As in a real job: every rank reports when its process group comes up, before any
        # collective runs.
        publish(
            kafka_bootstrap,
            lambda m: f"{prefix}.{TOPICS_BY_KIND[m.kind].kind}",  # type: ignore[attr-defined]
            list(ring_members(job, range(job.n))),
        )
        placements = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": f"jobs-{unique}",
                "auto.offset.reset": "earliest",
            }
        )
        placements.subscribe([f"{prefix}.job"])
        assembled: list[Job] = []
        deadline = time.monotonic() + 60
        while not assembled and time.monotonic() < deadline:
            record = placements.poll(0.5)
            if record is None or record.error() is not None:
                worker.assert_alive()
                continue
            message = decode(record.value())
            if isinstance(message, Job):
                assert record.key() == b"job-1"
                assembled.append(message)
        placements.close()
        publish(kafka_bootstrap, lambda m: f"{prefix}.collective", list(bare))
        reader = DiagnosisReader(kafka_bootstrap, f"{prefix}.diagnosis", f"check-{unique}")
        found = reader.until(lambda f: bool(f), 90, worker.assert_alive)
        reader.close()
    (placement,) = assembled
    assert [(p.rank, p.node, p.gpu) for p in placement.ranks][11] == (11, "node-001", 3)
    # The hang is named by GPU although no collective message said where it ran.
    assert [(d.class_, d.suspects[0].id) for d in found] == [("noncomm_hang", "node-001/gpu3")]

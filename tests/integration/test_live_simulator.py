"""The live pipeline through the real commands: c4 simulate --kafka -> c4 streams worker."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
from confluent_kafka import Consumer

from schemas.codec import decode
from schemas.messages import Diagnosis

SCENARIO = {
    "seed": 5,
    "duration_s": 40,
    "jobs": [{"id": "job-live", "ranks": 16, "compute_ms": 100}],
    "faults": [{"type": "process_stuck", "job": "job-live", "rank": 9, "at_s": 12}],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_simulated_fault_found_live(kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    env = dict(
        os.environ,
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        C4_TOPIC_PREFIX=f"test.{unique}.",
        C4_TOPIC_PARTITIONS="4",
    )
    c4 = [sys.executable, "-m", "c4.cli"]
    created = subprocess.run([*c4, "topics", "create"], env=env, capture_output=True, timeout=60)
    assert created.returncode == 0, created.stderr
    assert f"test.{unique}.c4.collective.v1 created".encode() in created.stdout
    scenario = tmp_path / "scenario.json"
    scenario.write_bytes(orjson.dumps(SCENARIO))
    truth = tmp_path / "truth.jsonl"
    metrics_port = free_port()
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [
                *c4,
                "streams",
                "worker",
                "--app-id",
                f"test-{unique}",
                "--clock-rate",
                "10",
                "--web-port",
                str(free_port()),
                "--metrics-port",
                str(metrics_port),
                "--loglevel",
                "warn",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            published = subprocess.run(
                [
                    *c4,
                    "simulate",
                    "--scenario",
                    str(scenario),
                    "--kafka",
                    "--speed",
                    "10",
                    "--truth",
                    str(truth),
                ],
                env=env,
                capture_output=True,
                timeout=120,
            )
            assert published.returncode == 0, published.stderr
            assert b"messages published" in published.stderr
            expected = orjson.loads(truth.read_bytes().splitlines()[0])
            consumer = Consumer(
                {
                    "bootstrap.servers": kafka_bootstrap,
                    "group.id": f"check-{unique}",
                    "auto.offset.reset": "earliest",
                }
            )
            consumer.subscribe([f"test.{unique}.c4.diagnosis.v1"])
            found: list[Diagnosis] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not found:
                record = consumer.poll(0.5)
                if record is None or record.error() is not None:
                    assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                    continue
                result = decode(record.value())
                assert isinstance(result, Diagnosis)
                found.append(result)
            consumer.close()
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
                metrics = response.read().decode()
        finally:
            worker.terminate()
            worker.wait(30)
    assert found, "no diagnosis published"
    assert found[0].class_ in expected["classes"]
    assert found[0].suspects[0].id == expected["suspect"]["id"]
    assert found[0].job == "job-live"
    # The worker's Prometheus endpoint counted what it took and what it concluded.
    assert 'c4_stream_messages_total{kind="collective"}' in metrics
    hang_count = re.compile(r'c4_stream_diagnoses_total\{[^}]*class="noncomm_hang"[^}]*\} 1\.0')
    assert hang_count.search(metrics), metrics[-2500:]
    assert "c4_stream_processing_seconds_bucket" in metrics

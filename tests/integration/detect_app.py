"""The detection worker for the tests, on topics named by the environment."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import orjson

from c4.streams_wiring import faust_broker_url
from schemas.codec import decode_object
from schemas.files import Topology
from streams.detection_app import DetectionConfig, create_detection_app

PREFIX = os.environ["C4_TEST_TOPIC_PREFIX"]
KINDS = ("collective", "link", "gpu", "job", "route", "deadletter", "diagnosis")

TOPOLOGY = os.environ.get("C4_TEST_TOPOLOGY")
topology = (
    decode_object(orjson.loads(Path(TOPOLOGY).read_bytes()), "topology") if TOPOLOGY else None
)
if topology is not None and not isinstance(topology, Topology):
    message = f"bad test topology: {topology}"
    raise SystemExit(message)

worker = create_detection_app(
    DetectionConfig(
        app_id=os.environ["C4_TEST_APP_ID"],
        broker=faust_broker_url(os.environ.get("C4_KAFKA_BOOTSTRAP", "127.0.0.1:9092")),
        partitions=int(os.environ.get("C4_TEST_PARTITIONS", "4")),
        topic_names={kind: f"{PREFIX}.{kind}" for kind in KINDS},
        clock_rate=float(os.environ.get("C4_TEST_CLOCK_RATE", "1")),
        tick_s=0.2,
        snapshot_interval_s=0.5,
        topology=topology,
        split=os.environ.get("C4_TEST_SPLIT") == "1",
        app_settings={
            "datadir": os.environ.get("C4_TEST_DATADIR") or tempfile.mkdtemp(),
            # A killed member holds its partitions until its session times out: short here.
            "broker_session_timeout": float(os.environ.get("C4_TEST_SESSION_TIMEOUT", "60")),
            "broker_heartbeat_interval": 1.0,
            # Named, so that a test can tell which worker owns which partitions.
            "broker_client_id": os.environ.get("C4_TEST_CLIENT_ID", "c4-test-worker"),
        },
    )
)
app = worker.app
if os.environ.get("C4_TEST_METRICS_PORT"):
    worker.metrics.serve(int(os.environ["C4_TEST_METRICS_PORT"]), "127.0.0.1")

if __name__ == "__main__":
    app.main()

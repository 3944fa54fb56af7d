"""The detection worker for the tests, on topics named by the environment."""

from __future__ import annotations

import os

from c4.streams_cmd import faust_broker_url
from streams.app import create_detection_app
from streams.core.engine import Engine
from streams.live import LiveDetection

PREFIX = os.environ["C4_TEST_TOPIC_PREFIX"]
KINDS = ("collective", "link", "gpu", "job", "route", "deadletter", "diagnosis")

app = create_detection_app(
    os.environ["C4_TEST_APP_ID"],
    faust_broker_url(os.environ.get("C4_KAFKA_BOOTSTRAP", "127.0.0.1:9092")),
    LiveDetection(Engine(), clock_rate=float(os.environ.get("C4_TEST_CLOCK_RATE", "1"))),
    partitions=4,
    topic_names={kind: f"{PREFIX}.{kind}" for kind in KINDS},
    tick_s=0.2,
)

if __name__ == "__main__":
    app.main()

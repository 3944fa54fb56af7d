"""The decode-only ceiling for bench_streams.py: the same decoding agents, no detection.

    python bench/decode_only_app.py worker --without-web -l warn

Environment: C4_KAFKA_BOOTSTRAP, C4_TOPIC_PREFIX, C4_TOPIC_PARTITIONS, C4_BENCH_APP_ID,
C4_BENCH_METRICS_PORT (its Prometheus endpoint, counting decoded messages like the worker).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from c4.settings import load_settings  # noqa: E402
from c4.streams_wiring import faust_broker_url  # noqa: E402
from schemas.base import C4Model  # noqa: E402
from schemas.topics import ALL_TOPICS  # noqa: E402
from streams.intake_app import INPUT_TOPICS, create_app  # noqa: E402
from streams.metrics import StreamMetrics  # noqa: E402

settings = load_settings()
metrics = StreamMetrics()


async def count(key: str | None, message: C4Model) -> None:
    """Only count: what the detection worker does minus the detectors."""
    metrics.messages.labels(str(getattr(message, "kind", ""))).inc()


app = create_app(
    os.environ["C4_BENCH_APP_ID"],
    faust_broker_url(settings.kafka_bootstrap),
    partitions=settings.topic_partitions,
    topic_names={topic.kind: settings.topic_prefix + topic.name for topic in ALL_TOPICS},
    handlers={topic.kind: count for topic in INPUT_TOPICS},
    broker_config={"datadir": tempfile.mkdtemp(prefix="c4-bench-")},
)

if __name__ == "__main__":
    metrics.serve(int(os.environ["C4_BENCH_METRICS_PORT"]))
    app.main()

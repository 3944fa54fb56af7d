"""The detection app for Faust's own command line: ``faust -A streams.faust_app worker``.

Configured like ``c4 streams worker`` from the ``C4_*`` settings (brokers, topic prefix,
partitions); ``C4_STREAMS_APP_ID`` (default c4-streams), ``C4_STREAMS_TOPOLOGY``,
``C4_STREAMS_CLOCK_RATE`` and ``C4_STREAMS_METRICS_PORT`` (default 9464, 0: off) for the rest.
"""

from __future__ import annotations

import os

from c4.inputs import load_document
from c4.settings import load_settings
from c4.streams_cmd import faust_broker_url
from schemas.files import Topology
from schemas.topics import ALL_TOPICS
from streams.detection_app import DetectionConfig, create_detection_app

_settings = load_settings()
_app_id = os.environ.get("C4_STREAMS_APP_ID", "c4-streams")
_topology_path = os.environ.get("C4_STREAMS_TOPOLOGY")
worker = create_detection_app(
    DetectionConfig(
        app_id=_app_id,
        broker=faust_broker_url(_settings.kafka_bootstrap),
        partitions=_settings.topic_partitions,
        topic_names={topic.kind: _settings.topic_prefix + topic.name for topic in ALL_TOPICS},
        topology=load_document(_topology_path, "topology", Topology) if _topology_path else None,
        clock_rate=float(os.environ.get("C4_STREAMS_CLOCK_RATE", "1")),
        app_settings={"datadir": str(_settings.stack_dir / "faust" / _app_id)},
    )
)
app = worker.app


async def _serve_metrics() -> None:
    """Prometheus /metrics on 127.0.0.1, once the worker runs (not on import)."""
    port = int(os.environ.get("C4_STREAMS_METRICS_PORT", "9464"))
    if port:
        worker.metrics.serve(port)


app.task(_serve_metrics)

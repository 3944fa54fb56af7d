"""The streams worker built from settings, in one place: for `c4 streams worker` and for
Faust's own command line (``faust -A c4.faust_app worker``) alike.

Both get the same Kafka access check, SASL/TLS credentials, data folder, session timeout,
detector parameters and topology, and both read the ``C4_STREAMS_*`` variables; the command's
arguments win over them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from c4 import C4Error

if TYPE_CHECKING:
    from c4.settings import Settings
    from streams.detection_app import DetectionWorker

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_S = 60.0
DEFAULT_METRICS_PORT = 9464


class StreamsOptionsError(C4Error):
    """A ``C4_STREAMS_*`` variable is unusable (exit 2, as a bad setting)."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class StreamsOptions:
    """What a streams worker is told beyond the shared ``C4_*`` settings."""

    app_id: str | None = None  # None: the deployment's (`c4.deployment`)
    topology: str | None = None
    params: str | None = None
    clock_rate: float = 1.0
    snapshot_interval_s: float = 1.0
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S
    web_port: int | None = None
    web_bind: str = "127.0.0.1"
    metrics_port: int = DEFAULT_METRICS_PORT
    split: bool = False  # one job's detection spread over the workers (`streams.split_app`)


def faust_broker_url(bootstrap: str) -> str:
    """Faust's broker URL for a librdkafka-style bootstrap list (``h1:9092,h2:9092``)."""
    hosts = [host.strip() for host in bootstrap.split(",") if host.strip()]
    return "kafka://" + ";".join(hosts)


def options_from_env(environ: Mapping[str, str]) -> StreamsOptions:
    """The streams options of the environment: ``C4_STREAMS_APP_ID`` (unset: the deployment's),
    ``_TOPOLOGY``, ``_PARAMS``, ``_CLOCK_RATE``, ``_SNAPSHOT_INTERVAL``, ``_SESSION_TIMEOUT``,
    ``_METRICS_PORT`` (0: off) and ``_SPLIT`` (1: one job spread over the workers).
    ``c4 streams worker``'s options win over them; under ``faust -A c4.faust_app`` Faust's
    own options set its web server."""

    def number(name: str, default: float, low: float, high: float) -> float:
        text = environ.get(name)
        if text is None or text == "":
            return default
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:
            message = f"{name}: expected a number from {low:g} to {high:g}, got {text!r}"
            raise StreamsOptionsError(message)
        return value

    return StreamsOptions(
        app_id=environ.get("C4_STREAMS_APP_ID") or None,
        topology=environ.get("C4_STREAMS_TOPOLOGY") or None,
        params=environ.get("C4_STREAMS_PARAMS") or None,
        clock_rate=number("C4_STREAMS_CLOCK_RATE", 1.0, 1e-6, 1e6),
        snapshot_interval_s=number("C4_STREAMS_SNAPSHOT_INTERVAL", 1.0, 0.01, 3600),
        session_timeout_s=number("C4_STREAMS_SESSION_TIMEOUT", DEFAULT_SESSION_TIMEOUT_S, 6, 1800),
        metrics_port=int(number("C4_STREAMS_METRICS_PORT", DEFAULT_METRICS_PORT, 0, 65535)),
        split=bool(number("C4_STREAMS_SPLIT", 0, 0, 1)),
    )


def build_streams_worker(settings: Settings, options: StreamsOptions) -> DetectionWorker:
    """The detection worker: Kafka checked and credentials applied, state folder, params."""
    # Imported here: Faust is heavy and only the streams worker needs it.
    from c4.cluster_state import FROM_STATE, topology_from_state
    from c4.inputs import load_document, load_params
    from c4.security import check_kafka_access, faust_credentials
    from schemas.files import Topology
    from schemas.topics import TopicNames
    from streams.core.params import DetectorParams
    from streams.detection_app import DetectionConfig, create_detection_app

    topology: Topology | None = None
    if options.topology == FROM_STATE:
        topology = topology_from_state(settings)
    elif options.topology:
        topology = load_document(options.topology, "topology", Topology)
    params, job_params = load_params(options.params) if options.params else (DetectorParams(), {})
    # Wrong credentials or protocol: one line now, rather than Faust retrying forever.
    check_kafka_access(settings, timeout_s=5.0, require_answer=False)
    credentials = faust_credentials(settings)
    app_id = options.app_id or settings.names.streams_app_id
    if options.split:
        _create_split_topics(settings, app_id)
    app_settings: dict[str, object] = {
        # Faust keeps a small folder per app (its table metadata); not in the current folder.
        "datadir": str(settings.deployment_dir / "faust" / app_id),
        # A killed worker's partitions wait this long before the group hands them on.
        "broker_session_timeout": options.session_timeout_s,
    }
    if credentials is not None:
        app_settings["broker_credentials"] = credentials
    config = DetectionConfig(
        app_id=app_id,
        broker=faust_broker_url(settings.kafka_bootstrap),
        partitions=settings.topic_partitions,
        topic_names=TopicNames(settings.topic_prefix).by_kind(),
        params=params,
        job_params=job_params,
        topology=topology,
        clock_rate=options.clock_rate,
        snapshot_interval_s=options.snapshot_interval_s,
        web_port=options.web_port,
        web_bind=options.web_bind,
        app_settings=app_settings,
        split=options.split,
    )
    return create_detection_app(config)


def _create_split_topics(settings: Settings, app_id: str) -> None:
    """The split's internal topics, before the app subscribes to them (see
    `streams.split_app.internal_topics`). A broker that does not answer yet is left to
    Faust, which declares them as it starts."""
    from c4.topics import TopicError, create_named_topics
    from streams.split_app import internal_topics

    try:
        topics = internal_topics(app_id)
        create_named_topics(settings, topics, settings.topic_partitions, timeout_s=10.0)
    except TopicError as error:
        log.warning("the split's topics were not created before the start: %s", error)

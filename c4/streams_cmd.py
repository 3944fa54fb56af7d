"""``c4 streams worker``: run the Faust app against the configured brokers."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from c4.settings import Settings


def faust_broker_url(bootstrap: str) -> str:
    """Faust's broker URL for a librdkafka-style bootstrap list (``h1:9092,h2:9092``)."""
    hosts = [host.strip() for host in bootstrap.split(",") if host.strip()]
    return "kafka://" + ";".join(hosts)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: Faust is heavy and only this subcommand needs it.
    import faust

    from c4.diagnose_cmd import load_params
    from c4.inputs import load_document
    from c4.security import check_kafka_access, faust_credentials
    from schemas.files import Topology
    from schemas.topics import ALL_TOPICS
    from streams.core.params import DetectorParams
    from streams.detection_app import DetectionConfig, create_detection_app
    from streams.logs import json_logging_config

    topology = load_document(args.topology, "topology", Topology) if args.topology else None
    # Wrong credentials or protocol: one line now, rather than Faust retrying forever.
    check_kafka_access(settings, timeout_s=5.0, require_answer=False)
    credentials = faust_credentials(settings)
    app_settings: dict[str, object] = {
        # Faust keeps a small folder per app (its table metadata); not in the current folder.
        "datadir": str(settings.stack_dir / "faust" / args.app_id),
        # A killed worker's partitions wait this long before the group hands them on.
        "broker_session_timeout": args.session_timeout,
    }
    if credentials is not None:
        app_settings["broker_credentials"] = credentials
    params, job_params = load_params(args.params) if args.params else (DetectorParams(), {})
    config = DetectionConfig(
        app_id=args.app_id,
        broker=faust_broker_url(settings.kafka_bootstrap),
        partitions=settings.topic_partitions,
        topic_names={topic.kind: settings.topic_prefix + topic.name for topic in ALL_TOPICS},
        params=params,
        job_params=job_params,
        topology=topology,
        clock_rate=args.clock_rate,
        snapshot_interval_s=args.snapshot_interval,
        web_port=args.web_port,
        web_bind=args.web_bind,
        app_settings=app_settings,
    )
    worker = create_detection_app(config)
    if args.metrics_port:
        worker.metrics.serve(args.metrics_port)
    logging_config = json_logging_config(args.loglevel) if args.log_format == "json" else None
    runner = faust.Worker(worker.app, loglevel=args.loglevel, logging_config=logging_config)
    # Faust's terminal spinner sets the root logger to DEBUG (it spins on every record), so
    # every library's debug record was built and then dropped: 4-8% of a busy worker's time.
    runner.spinner = None
    runner.execute_from_commandline()
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        message = f"must be > 0, got {text}"
        raise argparse.ArgumentTypeError(message)
    return value


def _session_timeout(text: str) -> float:
    value = float(text)
    # The broker's group.min.session.timeout.ms is 6 s by default; heartbeats go every 3 s.
    if not 6 <= value <= 1800:
        message = f"must be between 6 and 1800 seconds, got {text}"
        raise argparse.ArgumentTypeError(message)
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``streams worker`` subcommand."""
    parser = subparsers.add_parser("streams", help="the stream processors (Faust app)")
    actions = parser.add_subparsers(dest="streams_command", required=True, metavar="ACTION")
    worker = actions.add_parser("worker", help="run a Faust worker")
    worker.add_argument("--app-id", default="c4-streams", help="Faust app id = consumer group")
    worker.add_argument("--web-port", type=int, default=6066, help="Faust web port (127.0.0.1)")
    worker.add_argument(
        "--web-bind", default="127.0.0.1", help="address of the web server (0.0.0.0 in a container)"
    )
    worker.add_argument(
        "--clock-rate",
        type=_positive,
        default=1.0,
        help="event seconds per wall second while silent (a sped-up simulator: its speed)",
    )
    worker.add_argument("--topology", help="v1 topology file (enables the fabric correlator)")
    worker.add_argument("--params", help='detector parameters: {"defaults": {}, "jobs": {}}')
    worker.add_argument(
        "--snapshot-interval",
        type=_positive,
        default=1.0,
        help="seconds between state snapshots of changed jobs (findings: at once)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="Prometheus /metrics on 127.0.0.1 (0: off)",
    )
    worker.add_argument(
        "--session-timeout",
        type=_session_timeout,
        default=60.0,
        help="consumer group session timeout, s: how soon a dead worker's partitions move (60)",
    )
    worker.add_argument("--loglevel", default="info", choices=("debug", "info", "warn", "error"))
    worker.add_argument(
        "--log-format", default="text", choices=("text", "json"), help="json: one object a line"
    )
    worker.set_defaults(handler=_run)

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

    from schemas.topics import ALL_TOPICS
    from streams.app import create_detection_app
    from streams.core.engine import Engine
    from streams.live import LiveDetection

    live = LiveDetection(Engine(), clock_rate=args.clock_rate)
    if args.metrics_port:
        live.metrics.serve(args.metrics_port)
    app = create_detection_app(
        args.app_id,
        faust_broker_url(settings.kafka_bootstrap),
        live,
        partitions=settings.topic_partitions,
        topic_names={topic.kind: settings.topic_prefix + topic.name for topic in ALL_TOPICS},
        web_port=args.web_port,
        web_bind=args.web_bind,
    )
    worker = faust.Worker(app, loglevel=args.loglevel)
    worker.execute_from_commandline()
    return 0


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
        type=float,
        default=1.0,
        help="event seconds per wall second while silent (a sped-up simulator: its speed)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="Prometheus /metrics on 127.0.0.1 (0: off)",
    )
    worker.add_argument("--loglevel", default="info", choices=("debug", "info", "warn", "error"))
    worker.set_defaults(handler=_run)

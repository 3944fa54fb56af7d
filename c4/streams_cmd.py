"""``c4 streams worker``: run the Faust app against the configured brokers."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from c4.gc_tuning import fewer_collections
from c4.streams_wiring import (
    DEFAULT_METRICS_PORT,
    DEFAULT_SESSION_TIMEOUT_S,
    StreamsOptions,
    options_from_env,
)

if TYPE_CHECKING:
    from c4.settings import Settings


def options_of(args: argparse.Namespace, environ: Mapping[str, str]) -> StreamsOptions:
    """The worker's options: the ``C4_STREAMS_*`` variables, as ``faust -A c4.faust_app``
    reads them, and over them every option given."""
    given = {
        "app_id": args.app_id,
        "topology": args.topology,
        "params": args.params,
        "clock_rate": args.clock_rate,
        "snapshot_interval_s": args.snapshot_interval,
        "session_timeout_s": args.session_timeout,
        "metrics_port": args.metrics_port,
        "split": args.split,
    }
    return dataclasses.replace(
        options_from_env(environ),
        web_port=args.web_port,
        web_bind=args.web_bind,
        **{name: value for name, value in given.items() if value is not None},
    )


def _run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: Faust is heavy and only this subcommand needs it.
    import faust

    from c4.streams_wiring import build_streams_worker
    from streams.logs import json_logging_config

    options = options_of(args, os.environ)
    worker = build_streams_worker(settings, options)
    if options.metrics_port:
        worker.metrics.serve(options.metrics_port, args.metrics_address or settings.metrics_address)
    logging_config = json_logging_config(args.loglevel) if args.log_format == "json" else None
    runner = faust.Worker(worker.app, loglevel=args.loglevel, logging_config=logging_config)
    # Faust's terminal spinner sets the root logger to DEBUG (it spins on every record), so
    # every library's debug record was built and then dropped: 4-8% of a busy worker's time.
    runner.spinner = None
    with fewer_collections():
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
    worker.add_argument(
        "--app-id",
        help="Faust app id = consumer group (env C4_STREAMS_APP_ID; default: the deployment's,"
        " <C4_DEPLOYMENT>.c4-streams, or c4-streams)",
    )
    worker.add_argument("--web-port", type=int, default=6066, help="Faust web port (127.0.0.1)")
    worker.add_argument(
        "--web-bind", default="127.0.0.1", help="address of the web server (0.0.0.0 in a container)"
    )
    worker.add_argument(
        "--clock-rate",
        type=_positive,
        help="event seconds per wall second while silent (a sped-up simulator: its speed;"
        " env C4_STREAMS_CLOCK_RATE, default 1)",
    )
    worker.add_argument(
        "--topology",
        help="v1 topology file, or 'redis': the one c4 state load put in the cluster state "
        "(enables the fabric correlator and the cabling check; env C4_STREAMS_TOPOLOGY)",
    )
    worker.add_argument(
        "--params",
        help='detector parameters: {"defaults": {}, "jobs": {}} (env C4_STREAMS_PARAMS)',
    )
    worker.add_argument(
        "--split",
        action="store_true",
        default=None,
        help="spread each job's detection over the workers: node stages on an internal"
        " topic keyed by job and node, the job stage fed their shares (env C4_STREAMS_SPLIT=1)",
    )
    worker.add_argument(
        "--snapshot-interval",
        type=_positive,
        help="seconds between state snapshots of changed jobs (findings: at once;"
        " env C4_STREAMS_SNAPSHOT_INTERVAL, default 1)",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        help="Prometheus /metrics port (0: off; env C4_STREAMS_METRICS_PORT,"
        f" default {DEFAULT_METRICS_PORT})",
    )
    worker.add_argument(
        "--metrics-address",
        help="address /metrics binds (default C4_METRICS_ADDRESS, else 127.0.0.1;"
        " 0.0.0.0 for a Prometheus in another container)",
    )
    worker.add_argument(
        "--session-timeout",
        type=_session_timeout,
        help="consumer group session timeout, s: how soon a dead worker's partitions move"
        f" (env C4_STREAMS_SESSION_TIMEOUT, default {DEFAULT_SESSION_TIMEOUT_S:g})",
    )
    worker.add_argument("--loglevel", default="info", choices=("debug", "info", "warn", "error"))
    worker.add_argument(
        "--log-format", default="text", choices=("text", "json"), help="json: one object a line"
    )
    worker.set_defaults(handler=_run)

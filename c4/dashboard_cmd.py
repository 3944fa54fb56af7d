"""``c4 dashboard``: the live web page of the cluster state, findings and actions."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from c4 import C4Error
from c4.stopping import stop_on_signals

if TYPE_CHECKING:
    from c4.settings import Settings


class DashboardStartError(C4Error):
    """The dashboard cannot start: Redis away, the port taken (exit 2)."""

    exit_code = 2


def _run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: aiohttp is only this command's (and the demo's).
    from c4.cluster_state import open_state
    from c4.dashboard.feed import Feed
    from c4.dashboard.server import DashboardError, DashboardServer, Source

    state = open_state(settings)
    try:
        state.client.ping()
    except Exception as error:  # noqa: BLE001 - any failure to reach Redis is reported alike
        message = f"redis at {settings.redis_url} does not answer ({error})"
        raise DashboardStartError(message) from None
    with stop_on_signals() as stop:
        group = args.group or settings.names.dashboard_group()
        feed = Feed(settings.kafka_client_config(), settings.topic_prefix, group).start()
        server = DashboardServer(Source(state, feed, args.title), args.bind, args.port)
        try:
            server.start()
        except DashboardError as error:
            feed.stop()
            raise DashboardStartError(str(error)) from None
        print(f"dashboard: {server.url} (Redis prefix {settings.redis_key_prefix})", flush=True)
        stop.wait()
        server.stop()
        feed.stop()
        state.close()
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``dashboard`` subcommand."""
    parser = subparsers.add_parser(
        "dashboard",
        help="web page: nodes by state, links by utilisation, open findings, action log",
        description=(
            "Serves the dashboard page and its JSON endpoints (/api/state, /api/cluster, "
            "/api/findings, /api/actions) from the cluster state in Redis and the diagnosis, "
            "action, route and job topics."
        ),
    )
    parser.add_argument("--port", type=int, default=8066, help="port (8066)")
    parser.add_argument("--bind", default="127.0.0.1", help="address (0.0.0.0 in a container)")
    parser.add_argument(
        "--group", help="consumer group of its feed (default: a new one of the deployment's)"
    )
    parser.add_argument("--title", default="c4", help="page title")
    parser.set_defaults(handler=_run)

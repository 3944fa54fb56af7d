"""The dashboard's web server (aiohttp): one static page and the JSON endpoints behind it.

- ``GET /``: the page (plain HTML and JavaScript, no build step), polling the endpoints;
- ``GET /api/cluster``: nodes by state, fabric links by utilisation, jobs, spares;
- ``GET /api/findings``: the open findings with their evidence;
- ``GET /api/actions``: the action log, newest first;
- ``GET /api/state``: the three above in one answer (what the page polls);
- ``GET /metrics``: Prometheus: ``c4_dashboard_requests_total{endpoint,status}``,
  ``c4_dashboard_open_findings``, ``c4_dashboard_feed_records`` (diagnoses, actions, routes and
  placements held).

Redis is read in a worker thread (its client blocks); the server runs in its own thread
with its own event loop, so the demo and ``c4 dashboard`` embed it alike.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from importlib import resources
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from actions.state.store import RedisState
from c4.dashboard.feed import Feed
from c4.dashboard.model import action_log, cluster_map, findings
from schemas.codec import decode_object
from schemas.files import Topology

TOPOLOGY_TTL_S = 10.0
log = logging.getLogger(__name__)


class RequestLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's request log, with a request it cannot parse (an over-long URL or header,
    a malformed line) as one warning line: the client's mistake, answered with a 400, is
    no traceback in the operator's log."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        """Log an error while handling a request; a client's bad request in one line."""
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError):
            detail = " ".join(str(error.message).split())[:120]
            text = str(msg) % args if args else str(msg)
            self.warning("%s: %s %s: %s", text, error.code, type(error).__name__, detail)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


class DashboardError(Exception):
    """The dashboard cannot show the cluster: no topology loaded, Redis away (one line)."""


class Source:
    """Where the dashboard's data comes from: the cluster state in Redis and a Kafka feed."""

    def __init__(self, state: RedisState, feed: Feed, title: str = "c4") -> None:
        self.state = state
        self.feed = feed
        self.title = title
        self._topology: tuple[float, Topology] | None = None
        self._lock = threading.Lock()

    def topology(self) -> Topology:
        """The topology last loaded into the cluster state (cached for a few seconds)."""
        with self._lock:
            now = time.monotonic()
            if self._topology is not None and now - self._topology[0] < TOPOLOGY_TTL_S:
                return self._topology[1]
            raw = self.state.client.get(self.state.keys.topology)
            if raw is None:
                message = f"no topology loaded under {self.state.keys.prefix} (c4 state load)"
                raise DashboardError(message)
            document = decode_object(orjson.loads(raw), "topology")
            if not isinstance(document, Topology):
                message = f"the topology under {self.state.keys.prefix} is not valid: {document}"
                raise DashboardError(message)
            self._topology = (now, document)
            return document

    def everything(self) -> dict[str, Any]:
        """The page's whole state in one answer."""
        view = self.feed.view()
        return {
            "title": self.title,
            "cluster": cluster_map(self.topology(), self.state.snapshot(), view),
            "findings": findings(view),
            "actions": action_log(view),
            "feed_error": self.feed.error,
        }

    def cluster(self) -> dict[str, Any]:
        """The cluster map alone."""
        return cluster_map(self.topology(), self.state.snapshot(), self.feed.view())


def _page() -> bytes:
    return resources.files("c4.dashboard").joinpath("static/index.html").read_bytes()


def create_app(source: Source) -> web.Application:
    """The aiohttp application serving the page and the endpoints."""
    page = _page()
    registry = CollectorRegistry()
    requests = Counter(
        "c4_dashboard_requests", "Requests answered", ["endpoint", "status"], registry=registry
    )
    open_gauge = Gauge("c4_dashboard_open_findings", "Open findings", registry=registry)
    held = Gauge("c4_dashboard_feed_records", "Records held by the feed", registry=registry)

    async def blocking(call: Any, endpoint: str) -> web.Response:
        try:
            data = await asyncio.get_running_loop().run_in_executor(None, call)
        except DashboardError as error:
            requests.labels(endpoint, "503").inc()
            return _json({"error": str(error)}, 503)
        except Exception as error:  # noqa: BLE001 - Redis or Kafka away: say so, keep serving
            requests.labels(endpoint, "503").inc()
            return _json({"error": f"{type(error).__name__}: {error}"}, 503)
        requests.labels(endpoint, "200").inc()
        return _json(data)

    async def metrics(request: web.Request) -> web.Response:
        del request
        view = source.feed.view()
        open_gauge.set(len(view.open_findings()))
        held.set(len(view.diagnoses) + len(view.actions) + len(view.routes) + len(view.jobs))
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def index(request: web.Request) -> web.Response:
        del request
        return web.Response(body=page, content_type="text/html", charset="utf-8")

    async def state(request: web.Request) -> web.Response:
        del request
        return await blocking(source.everything, "state")

    async def cluster(request: web.Request) -> web.Response:
        del request
        return await blocking(source.cluster, "cluster")

    async def open_findings(request: web.Request) -> web.Response:
        del request
        return await blocking(lambda: findings(source.feed.view()), "findings")

    async def actions(request: web.Request) -> web.Response:
        del request
        return await blocking(lambda: action_log(source.feed.view()), "actions")

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/api/state", state)
    app.router.add_get("/api/cluster", cluster)
    app.router.add_get("/api/findings", open_findings)
    app.router.add_get("/api/actions", actions)
    app.router.add_get("/metrics", metrics)
    return app


def _json(data: Any, status: int = 200) -> web.Response:
    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, status=status, content_type="application/json")


class DashboardServer:
    """The app served on ``host:port`` from a background thread (port 0: any free one)."""

    def __init__(self, source: Source, host: str = "127.0.0.1", port: int = 0) -> None:
        self._source = source
        self._host = host
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="c4-dashboard", daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        """``http://host:port/``."""
        return f"http://{self._host}:{self.port}/"

    def start(self) -> DashboardServer:
        """Start serving; raises `DashboardError` when the port cannot be bound."""
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            message = f"dashboard: cannot listen on {self._host}:{self._port}: {self._error}"
            raise DashboardError(message)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        if self._runner is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(15)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = web.AppRunner(
                create_app(self._source), access_log=None, logger=RequestLog(log, {})
            )
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self._host, self._port)
            self._loop.run_until_complete(site.start())
            server = site._server  # noqa: SLF001 - aiohttp keeps the bound port there only
            sockets = getattr(server, "sockets", None) or ()
            self.port = int(sockets[0].getsockname()[1]) if sockets else self._port
        except OSError as error:
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

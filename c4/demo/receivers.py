"""The demo's job launcher and alert receiver: real HTTP on 127.0.0.1, signatures checked.

The action worker POSTs restarts to ``/launch`` and Alertmanager payloads to ``/alert``,
each signed ``X-C4-Signature: sha256=<HMAC-SHA256 of the body>``. A request with a wrong or
missing signature is answered 401 and not recorded.
"""

from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from actions.webhook import SIGNATURE_HEADER, sign

PATHS = ("/launch", "/alert")
MAX_BODY = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Call:
    """One accepted POST."""

    path: str
    ts: float
    body: Any
    headers: dict[str, str]


class Receivers:
    """A threaded HTTP server recording the launcher and alert calls it accepts."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._calls: list[Call] = []
        self._lock = threading.Lock()
        self.rejected = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                owner._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                del format, args  # quiet: the demo prints its own progress

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="c4-demo-receivers", daemon=True
        )

    @property
    def url(self) -> str:
        """The base URL, ``http://127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Receivers:
        """Serve in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def calls(self, path: str | None = None) -> list[Call]:
        """The accepted calls, oldest first (only those to ``path`` when given)."""
        with self._lock:
            return [c for c in self._calls if path is None or c.path == path]

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        if request.path not in PATHS or not 0 < length <= MAX_BODY:
            _answer(request, 404 if request.path not in PATHS else 400, b"")
            return
        body = request.rfile.read(length)
        given = request.headers.get(SIGNATURE_HEADER, "")
        if not hmac.compare_digest(given, sign(self._secret, body)):
            with self._lock:
                self.rejected += 1
            _answer(request, 401, b"bad signature")
            return
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            _answer(request, 400, b"not JSON")
            return
        headers = {key: value for key, value in request.headers.items()}
        with self._lock:
            self._calls.append(Call(request.path, time.time(), document, headers))
        _answer(request, 200, b'{"ok": true}')


def _answer(request: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)

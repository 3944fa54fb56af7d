"""Headless Chromium driven over the Chrome DevTools Protocol (aiohttp websocket, no Playwright).

`Browser` starts ``/usr/bin/chromium`` with its own profile, opens the page target and records
console errors, uncaught exceptions and failed log entries while the test navigates,
evaluates JavaScript and takes screenshots.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
    "--remote-debugging-port=0",
)


class Browser:
    """One headless Chromium and a CDP session on its first page."""

    def __init__(self, profile: Path) -> None:
        self._profile = profile
        self._process: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.errors: list[str] = []

    async def __aenter__(self) -> Browser:
        binary = shutil.which(CHROMIUM) or CHROMIUM
        self._process = subprocess.Popen(  # noqa: S603 - the system's chromium, fixed flags
            [binary, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if self._process.poll() is not None or time.monotonic() > deadline:
                message = f"chromium did not start (exit {self._process.poll()})"
                raise RuntimeError(message)
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as answer:
            targets = await answer.json()
        page = next(t for t in targets if t["type"] == "page")
        self._ws = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log"):
            await self.send(f"{domain}.enable")
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)

    async def _read(self) -> None:
        assert self._ws is not None
        async for frame in self._ws:
            message = json.loads(frame.data)
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
                continue
            method, params = message.get("method"), message.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                self.errors.append(" ".join(str(a.get("value")) for a in params.get("args", ())))
            elif method == "Runtime.exceptionThrown":
                self.errors.append(params["exceptionDetails"].get("text", "exception"))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                self.errors.append(params["entry"].get("text", ""))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command; its result (raises on a protocol error)."""
        assert self._ws is not None
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self._ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            message = f"{method}: {answer['error']}"
            raise RuntimeError(message)
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression in the page."""
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            message = f"{expression}: {result['exceptionDetails'].get('text')}"
            raise RuntimeError(message)
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = await self.evaluate(expression)
            except RuntimeError:
                value = None  # the page is still loading (no body yet)
            if value:
                return value
            if time.monotonic() > deadline:
                message = f"timed out waiting for: {expression}"
                raise AssertionError(message)
            await asyncio.sleep(0.2)

    async def screenshot(self) -> bytes:
        """The viewport as PNG bytes."""
        result = await self.send("Page.captureScreenshot", format="png")
        return base64.b64decode(result["data"])

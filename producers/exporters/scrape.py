"""Fetching an exposition over HTTP: URLs checked at start-up, bounded answers, problems counted."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from producers.prometheus_text import Sample, parse
from producers.sources import SourceFailed

DEFAULT_DCGM_URL = "http://127.0.0.1:9400/metrics"
DEFAULT_NODE_EXPORTER_URL = "http://127.0.0.1:9100/metrics"
DEFAULT_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 64 << 20
MAX_PROBLEMS = 20  # per round and kind; the rest are counted in one more line
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
USER_AGENT = "c4-agent"


# Fetch a URL within a timeout: (content type, body). `http_get`, or a test's stand-in.
Fetch = Callable[[str, float], tuple[str, str]]


class HttpStatusError(SourceFailed):
    """The server answered with an HTTP error status (``code``)."""

    def __init__(self, message: str, code: int, body: bytes = b"") -> None:
        super().__init__(message)
        self.code, self.body = code, body


# --- HTTP ------------------------------------------------------------------------------------


def check_url(text: str, what: str, *, default_path: str = "") -> str:
    """``text`` as an http(s) URL to use (``default_path`` added when it has no path);
    ValueError with a one-line reason otherwise."""
    if not text or any(char.isspace() for char in text):
        message = f"{what} {text!r} is not a URL"
        raise ValueError(message)
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in {"http", "https"}:
        message = f"{what} {text!r}: expected http:// or https://"
        raise ValueError(message)
    if not parts.hostname:
        message = f"{what} {text!r} names no host"
        raise ValueError(message)
    if parts.username is not None or parts.password is not None:
        message = f"{what} {text!r}: credentials in the URL are not supported"
        raise ValueError(message)
    if parts.fragment:
        message = f"{what} {text!r}: a URL with a #fragment"
        raise ValueError(message)
    try:
        parts.port  # noqa: B018 -- raises ValueError on a port out of range or not a number
    except ValueError:
        message = f"{what} {text!r}: not a port number"
        raise ValueError(message) from None
    if default_path and parts.path in {"", "/"}:
        parts = parts._replace(path=default_path)
    return urllib.parse.urlunsplit(parts)


# Exporters are on the node or in the cluster: environment proxies are not used.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout_s: float) -> tuple[str, str]:
    """The body (UTF-8) and content type of a GET; SourceFailed, one line, on any failure."""
    request = urllib.request.Request(  # noqa: S310 -- http(s) only, checked by check_url
        url, headers={"Accept": ACCEPT, "User-Agent": USER_AGENT}
    )
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            body: bytes = response.read(MAX_RESPONSE_BYTES + 1)
            content_type = str(response.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as error:
        message = f"{url}: HTTP {error.code} {error.reason}"
        try:
            body = error.read(4096)
        except OSError:
            body = b""
        finally:
            error.close()
        raise HttpStatusError(message, error.code, body) from None
    except urllib.error.URLError as error:
        message = f"{url}: {error.reason}"
        raise SourceFailed(message) from None
    except TimeoutError:
        message = f"{url}: no answer within {timeout_s:g} s"
        raise SourceFailed(message) from None
    except OSError as error:
        message = f"{url}: {error.strerror or error}"
        raise SourceFailed(message) from None
    if len(body) > MAX_RESPONSE_BYTES:
        message = f"{url}: answer larger than {MAX_RESPONSE_BYTES >> 20} MiB"
        raise SourceFailed(message)
    return body.decode("utf-8", errors="replace"), content_type


def scrape(url: str, timeout_s: float, fetch: Fetch) -> tuple[list[Sample], list[str]]:
    """The samples of one exposition and its problems (each naming the URL)."""
    text, content_type = fetch(url, timeout_s)
    exposition = parse(text, openmetrics=content_type.startswith("application/openmetrics-text"))
    return exposition.samples, [f"{url} {problem}" for problem in exposition.problems]


class Problems:
    """Problem lines of one round, capped (an exporter broken throughout says so once)."""

    def __init__(self, into: list[str]) -> None:
        self.into, self.dropped = into, 0

    def add(self, line: str) -> None:
        if len(self.into) < MAX_PROBLEMS:
            self.into.append(line)
        else:
            self.dropped += 1

    def close(self) -> None:
        if self.dropped:
            self.into.append(f"{self.dropped} more problems not listed")


def located(sample: Sample) -> str:
    return f"{sample.name} (line {sample.line})" if sample.line else sample.name


def host_of(instance: str) -> str:
    """The host part of a Prometheus ``instance`` label (``host:port``, ``[v6]:port``)."""
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    host, colon, port = instance.rpartition(":")
    return host if colon and port.isdigit() and host else instance

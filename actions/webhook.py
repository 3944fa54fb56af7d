"""One signed HTTP POST (stdlib urllib), its signature, and what its answer means for a retry.

2xx delivered; 408, 429, 5xx, timeouts and connection errors may pass on a later try; any
other 4xx will not (the receiver rejected the body). Retrying is the retry stage's job.
"""

from __future__ import annotations

import hashlib
import hmac
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

SIGNATURE_HEADER = "X-C4-Signature"
RETRYABLE_4XX = frozenset({408, 429})


def sign(secret: bytes, body: bytes) -> str:
    """The signature header's value: ``sha256=`` + hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | bytes) -> bool:
    """Whether a signature header matches the body (constant-time comparison; never raises).

    Compared as bytes: ``compare_digest`` refuses str with non-ASCII characters, and a
    receiver must answer a forged header with False, not an exception.
    """
    given = header if isinstance(header, bytes) else header.encode("utf-8", "surrogatepass")
    return hmac.compare_digest(sign(secret, body).encode("ascii"), given)


@dataclass(frozen=True, slots=True)
class Answer:
    """The receiver's answer: HTTP status (None: no answer), and why when not 2xx."""

    status: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        """Delivered."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        """A later try may succeed."""
        return self.status is None or self.status >= 500 or self.status in RETRYABLE_4XX


def post_json(
    url: str,
    body: bytes,
    timeout_s: float,
    secret: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """POST a JSON body, signed with HMAC-SHA256 when a secret is given; never raises."""
    request = urllib.request.Request(url, data=body, method="POST")  # noqa: S310 - http(s) only
    request.add_header("Content-Type", "application/json")
    request.add_header("User-Agent", "c4-actions/1")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    if secret is not None:
        request.add_header(SIGNATURE_HEADER, sign(secret, body))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            response.read()
            return Answer(int(response.status))
    except urllib.error.HTTPError as error:
        text = error.read(200).decode("utf-8", errors="replace").strip()
        return Answer(error.code, f"HTTP {error.code}" + (f": {text}" if text else ""))
    except TimeoutError:
        return Answer(None, f"no answer in {timeout_s} s")
    except urllib.error.URLError as error:
        return Answer(None, f"cannot connect: {error.reason}")
    except OSError as error:
        return Answer(None, f"cannot connect: {error}")

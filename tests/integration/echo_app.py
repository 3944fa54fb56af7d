"""A Faust worker for the tests: the real decoding agents, decoded models echoed to a topic.

Run as ``python -m tests.integration.echo_app worker``; topic names come from the
environment so that every test has its own.
"""

from __future__ import annotations

import os

from c4.streams_wiring import faust_broker_url
from schemas.base import C4Model
from schemas.codec import encode
from streams.intake_app import create_app

PREFIX = os.environ["C4_TEST_TOPIC_PREFIX"]
NAMES = {kind: f"{PREFIX}.{kind}" for kind in ("collective", "link", "gpu", "job", "deadletter")}


async def echo_decoded(key: str | None, message: C4Model) -> None:
    """Send the decoded model, re-encoded, to the echo topic (looked up at call time)."""
    await echo.send(key=(key or "").encode(), value=encode(message))


async def echo_or_fail(key: str | None, message: C4Model) -> None:
    """Like echo_decoded, but fails on one job id: a failing handler must not stop the agent."""
    if getattr(message, "job", None) == "job-explode":
        error = "handler failure injected by the test"
        raise RuntimeError(error)
    await echo_decoded(key, message)


app = create_app(
    os.environ["C4_TEST_APP_ID"],
    faust_broker_url(os.environ.get("C4_KAFKA_BOOTSTRAP", "127.0.0.1:9092")),
    partitions=4,
    topic_names=NAMES,
    handlers={"collective": echo_decoded, "job": echo_or_fail},
)
echo = app.topic(f"{PREFIX}.echo", key_serializer="raw", value_serializer="raw", partitions=4)

if __name__ == "__main__":
    app.main()

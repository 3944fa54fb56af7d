"""Turn a Faust stream of raw records into decoded v1 models; rejects become dead letters.

This is the only place the Faust agents touch bytes: they get models, and every rejected
record goes to ``c4.deadletter.v1`` with its reason while the stream goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from schemas.base import C4Model
from schemas.codec import Rejection, dead_letter, decode, encode

log = logging.getLogger(__name__)


def key_text(key: Any) -> str | None:
    """A record key as text (keys are UTF-8 ids on every v1 topic)."""
    if key is None:
        return None
    if isinstance(key, bytes | bytearray):
        return bytes(key).decode("utf-8", errors="backslashreplace")
    return str(key)


async def decoded(
    stream: Any, topic_name: str, kind: str, deadletters: Any
) -> AsyncIterator[tuple[str | None, C4Model]]:
    """Yield ``(key, model)`` for every valid record of ``stream``; dead-letter the rest."""
    async for event in stream.events():
        value = event.value
        raw = value if isinstance(value, bytes | bytearray) else str(value).encode()
        result = decode(raw, kind)
        key = key_text(event.key)
        if isinstance(result, Rejection):
            letter = dead_letter(topic_name, raw, result, time.time_ns())
            log.warning("rejected record on %s: %s", topic_name, result.reason)
            await deadletters.send(key=(key or "").encode(), value=encode(letter))
            continue
        yield key, result

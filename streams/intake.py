"""Turn a Faust stream of raw records into decoded v1 models; rejects become dead letters.

This is the only place the Faust agents touch bytes: they get models, and every rejected
record goes to ``c4.deadletter.v1`` with its reason while the stream goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from schemas.base import C4Model
from schemas.codec import RejectCode, Rejection, dead_letter, encode
from schemas.records import Rejected, decode_record

log = logging.getLogger(__name__)


def key_text(key: Any) -> str | None:
    """A record key as text (keys are UTF-8 ids on every v1 topic)."""
    if key is None:
        return None
    if isinstance(key, bytes | bytearray):
        return bytes(key).decode("utf-8", errors="backslashreplace")
    return str(key)


async def send_dead_letter(
    deadletters: Any, topic_name: str, key: str | None, raw: bytes, rejection: Rejection
) -> None:
    """Publish the dead letter of one record, keyed by the record's own key."""
    letter = dead_letter(topic_name, raw, rejection, time.time_ns())
    await deadletters.send(key=(key or "").encode(), value=encode(letter))


async def decoded_records(
    stream: Any,
    topic_name: str,
    kind: str,
    deadletters: Any,
    on_reject: Callable[[str, Rejection], None] | None = None,
) -> AsyncIterator[tuple[str | None, list[tuple[C4Model, bytes | None]]]]:
    """Yield ``(key, [(model, raw), ...])`` for each record of ``stream`` with a valid
    message; dead-letter the rest.

    A batch record yields its valid messages together (``raw`` None: the message is not the
    record) and dead-letters each invalid one alone, with its own JSON as the payload.
    """
    async for event in stream.events():
        value = event.value
        raw = bytes(value) if isinstance(value, bytes | bytearray) else str(value).encode()
        key = key_text(event.key)
        try:
            results = decode_record(raw, kind)
        except Exception as error:  # noqa: BLE001 - a record the codec fails on is a dead letter
            # Not one that stops the agent: its supervisor would restart it past the record
            # (lost, uncounted) and a burst of such records would stall the partition.
            log.exception("decoding a record on %s failed", topic_name)
            detail = f"{type(error).__name__}: {error}"
            results = [Rejected(Rejection(RejectCode.PROCESSING_FAILED, "", detail), raw)]
        whole = raw if len(results) == 1 else None
        taken: list[tuple[C4Model, bytes | None]] = []
        for result in results:
            if isinstance(result, Rejected):
                log.warning("rejected record on %s: %s", topic_name, result.reason)
                if on_reject is not None:
                    on_reject(topic_name, result.rejection)
                await send_dead_letter(
                    deadletters, topic_name, key, result.payload, result.rejection
                )
                continue
            taken.append((result, whole))
        if taken:
            yield key, taken
        # Give the event loop a turn after each record. While the stream's buffer holds
        # records, Faust hands them over without yielding, so a worker behind by a batch
        # backlog (tens of messages per record) would keep the loop for minutes: its timer,
        # offset commits and rebalance callbacks starve, and a rebalance never completes.
        await asyncio.sleep(0)


async def decoded(
    stream: Any,
    topic_name: str,
    kind: str,
    deadletters: Any,
    on_reject: Callable[[str, Rejection], None] | None = None,
) -> AsyncIterator[tuple[str | None, C4Model, bytes | None]]:
    """Yield ``(key, model, raw)`` for every valid message of ``stream``; dead-letter the
    rest (`decoded_records`, message by message)."""
    async for key, taken in decoded_records(stream, topic_name, kind, deadletters, on_reject):
        for model, raw in taken:
            yield key, model, raw

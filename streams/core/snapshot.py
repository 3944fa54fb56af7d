"""Detector state as bytes: what a worker writes to its changelog-backed table and reads back.

Plain data (lists, dicts, numbers, strings) as JSON, zlib-compressed: a 1,024-rank job's state
stays well under Kafka's default message size. A blob that does not decode is an error the
caller handles (it relearns instead of restoring); it is never executed or trusted further.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

from streams import StreamsError

FORMAT = 1


class SnapshotError(StreamsError):
    """A detector snapshot could not be read back."""


def encode_state(state: dict[str, Any]) -> bytes:
    """A snapshot's bytes."""
    return zlib.compress(orjson.dumps({"format": FORMAT, "state": state}), 1)


def decode_state(blob: bytes) -> dict[str, Any]:
    """The state a snapshot holds; `SnapshotError` when it is not one of ours."""
    try:
        document = orjson.loads(zlib.decompress(blob))
    except (zlib.error, orjson.JSONDecodeError) as error:
        message = f"not a detector snapshot: {error}"
        raise SnapshotError(message) from error
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        message = "not a detector snapshot of format 1"
        raise SnapshotError(message)
    state = document.get("state")
    if not isinstance(state, dict):
        message = "detector snapshot without a state"
        raise SnapshotError(message)
    return state

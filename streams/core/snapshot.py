"""Detector state as bytes: what a worker writes to its changelog-backed table and reads back.

Plain data (lists, dicts, numbers, strings) as JSON, zlib-compressed. A blob that does not
decode is an error the caller handles (it relearns instead of restoring); it is never
executed or trusted further.

A job's state grows with the job (a 128-rank 3D job's is 0.5-0.8 MB compressed, most of it
the ranks' recent operation times), and one table write is one Kafka record, which the
broker refuses past its ``message.max.bytes`` (1 MiB by default): the producer then fails
and the worker stalls. So `write_snapshot` cuts a blob over `MAX_PART_BYTES` into parts
under keys of their own (``<key>\x1f<id>:<i>``, in the key's partition), written before a
small head under the key itself; `read_snapshot` checks the parts against the head's length
and CRC, and old parts are deleted once the new head is written.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import MutableMapping
from typing import Any

import orjson

from streams import StreamsError

FORMAT = 1
MAX_PART_BYTES = 512 * 1024
# Between a key and its part's suffix: a control character no job or node id contains.
PART_SEPARATOR = b"\x1f"
_HEAD = b"C4PARTS1"

StateTable = MutableMapping[bytes, bytes]


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


def base_key(key: bytes) -> bytes:
    """The key a part belongs to (a key that is no part: itself)."""
    return key.split(PART_SEPARATOR, 1)[0]


def is_part_key(key: bytes) -> bool:
    """Whether a table key holds a part of a larger snapshot."""
    return PART_SEPARATOR in key


def write_snapshot(
    table: StateTable, key: bytes, state: dict[str, Any], max_part: int = MAX_PART_BYTES
) -> int:
    """Write a state under ``key`` (in parts if large); the number of records written."""
    blob = encode_state(state)
    old = _parts_of(key, table.get(key))
    if len(blob) <= max_part:
        table[key] = blob
        written = 1
    else:
        ident = secrets.token_hex(4)
        count = -(-len(blob) // max_part)
        for index in range(count):
            table[_part_key(key, ident, index)] = blob[index * max_part : (index + 1) * max_part]
        head = {"id": ident, "count": count, "size": len(blob), "crc": zlib.crc32(blob)}
        table[key] = _HEAD + orjson.dumps(head)
        written = count + 1
    for part in old:  # the previous snapshot's parts: nothing refers to them any more
        table.pop(part, None)
    return written


def delete_snapshot(table: StateTable, key: bytes) -> None:
    """Remove a snapshot and its parts."""
    for part in _parts_of(key, table.get(key)):
        table.pop(part, None)
    table.pop(key, None)


def read_snapshot(table: StateTable, key: bytes) -> dict[str, Any] | None:
    """The state under ``key``; None when there is none; `SnapshotError` when unreadable."""
    stored = table.get(key)
    if stored is None:
        return None
    if not stored.startswith(_HEAD):
        return decode_state(stored)
    head = _head(stored)
    pieces = []
    for index in range(head["count"]):
        piece = table.get(_part_key(key, head["id"], index))
        if piece is None:
            message = f"snapshot part {index} of {head['count']} is missing"
            raise SnapshotError(message)
        pieces.append(piece)
    blob = b"".join(pieces)
    if len(blob) != head["size"] or zlib.crc32(blob) != head["crc"]:
        message = "snapshot parts do not match their head (length or CRC)"
        raise SnapshotError(message)
    return decode_state(blob)


def _part_key(key: bytes, ident: str, index: int) -> bytes:
    return key + PART_SEPARATOR + f"{ident}:{index}".encode()


def _head(stored: bytes) -> dict[str, Any]:
    try:
        head = orjson.loads(stored[len(_HEAD) :])
        if not (
            isinstance(head, dict)
            and isinstance(head.get("id"), str)
            and all(type(head.get(field)) is int for field in ("count", "size", "crc"))
            and 0 < head["count"] <= 1 << 16
        ):
            raise TypeError(head)  # noqa: TRY301 - one error path for any bad head
    except (orjson.JSONDecodeError, TypeError) as error:
        message = f"not a snapshot head: {error}"
        raise SnapshotError(message) from error
    return head


def _parts_of(key: bytes, stored: bytes | None) -> list[bytes]:
    """The part keys a stored head refers to (none for a whole blob or a bad head)."""
    if stored is None or not stored.startswith(_HEAD):
        return []
    try:
        head = _head(stored)
    except SnapshotError:
        return []
    return [_part_key(key, head["id"], index) for index in range(head["count"])]

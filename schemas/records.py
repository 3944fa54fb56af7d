"""One Kafka record (or one line of a file) into its v1 messages, each valid or rejected.

A record is one message, or a batch: ``collectives`` (one job's collective messages from one
node), ``links`` or ``gpus`` (one node's link or GPU messages). A batch is taken apart here:
an invalid element is rejected alone, with its own field path (``messages[3].rank``) and
its own JSON as the dead letter's payload, and every other element is taken; only a broken
envelope (not JSON, no job or node, ``messages`` not an array...) rejects the whole record.
A ``collectives`` batch without messages that names its node is kept as that envelope:
the node's agent is up (its presence). Every reader of the input topics (the streams
worker, ``c4 diagnose``, ``c4 validate``) goes through `decode_record`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from schemas.base import C4Model
from schemas.codec import (
    MAX_MESSAGE_BYTES,
    RejectCode,
    Rejection,
    decode_object,
    invalid_json,
)
from schemas.fastpath import decode_hot_batch
from schemas.messages import (
    MAX_BATCH_MESSAGES,
    Collectives,
    not_of_the_batch,
)
from schemas.topics import INPUT_BATCHES, TOPICS_BY_KIND

# Each batch kind: the kind of its elements and the envelope field they all share (the
# record's key).
BATCHES: dict[str, tuple[str, str]] = {
    batch: (topic.kind, topic.key.value) for batch, topic in INPUT_BATCHES.items()
}


@dataclass(frozen=True, slots=True)
class Rejected:
    """One rejected message of a record and what its dead letter carries."""

    rejection: Rejection
    payload: bytes  # the rejected element's JSON, or the whole record's bytes

    @property
    def reason(self) -> str:
        """The rejection's one line."""
        return self.rejection.reason


@cache  # asked once per record, of a handful of reader kinds
def batch_kinds(kind: str | None) -> frozenset[str]:
    """The batch kinds a reader of ``kind`` takes apart: every one for None (any kind), a
    batch kind itself, or the batch kind of the topic ``kind`` is read from."""
    if kind is None:
        return frozenset(BATCHES)
    if kind in BATCHES:
        return frozenset((kind,))
    topic = TOPICS_BY_KIND.get(kind)
    if topic is None or topic.batch_kind is None or topic.kind != kind:
        return frozenset()
    return frozenset((topic.batch_kind,))


def decode_record(
    data: bytes | bytearray | memoryview | str, kind: str | None = None
) -> list[C4Model | Rejected]:
    """The messages of one record, in order: models, and `Rejected` for the invalid ones.

    ``kind`` names what the reader expects (e.g. the topic's kind); ``collective`` also
    takes ``collectives`` batches (``link`` takes ``links``, ``gpu`` takes ``gpus``), a batch
    kind takes batches only, None takes anything.
    """
    size = len(data)
    if size > MAX_MESSAGE_BYTES:
        detail = f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}"
        return [Rejected(Rejection(RejectCode.TOO_LARGE, "", detail), _raw(data))]
    batches = batch_kinds(kind)
    fast = decode_hot_batch(data, kind)
    if fast is not None:
        return list(fast)
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        return [Rejected(invalid_json(error), _raw(data))]
    if isinstance(obj, dict) and obj.get("v") == 1:
        batch = obj.get("kind")
        if isinstance(batch, str) and batch in batches:
            return _batch(obj, _raw(data), batch)
    result = decode_object(obj, kind)
    if isinstance(result, Rejection):
        return [Rejected(result, _raw(data))]
    return [result]


def _batch(obj: dict[str, Any], raw: bytes, batch: str) -> list[C4Model | Rejected]:
    """A batch the fast path did not take whole: its envelope, then element by element."""
    if "messages" not in obj:
        missing = Rejection(RejectCode.MISSING_FIELD, "messages", "required field missing")
        return [Rejected(missing, raw)]
    elements = obj["messages"]
    envelope = decode_object({**obj, "messages": []}, batch)
    if isinstance(envelope, Rejection):
        return [Rejected(envelope, raw)]
    if not isinstance(elements, list) or len(elements) > MAX_BATCH_MESSAGES:
        # Not an array, or too long: the model says which, in the contract's words (it
        # cannot accept such a batch: its field is a bounded array).
        whole = decode_object(obj, batch)
        assert isinstance(whole, Rejection)  # noqa: S101
        return [Rejected(whole, raw)]
    if not elements and isinstance(envelope, Collectives) and envelope.node is not None:
        # No message, a node: that node's agent is up while the job's ranks on it said
        # nothing this interval (contract: collectives, presence).
        return [envelope]
    element_kind, shared = BATCHES[batch]
    owner = obj[shared]  # the envelope is valid: the job (or node) is there
    found: list[C4Model | Rejected] = []
    for index, element in enumerate(elements):
        result = decode_object(element, element_kind)
        if not isinstance(result, Rejection) and getattr(result, shared) != owner:
            why = not_of_the_batch(shared, str(getattr(result, shared)), owner)
            result = Rejection(RejectCode.INCONSISTENT, shared, why)
        if isinstance(result, Rejection):
            path = f"messages[{index}].{result.path}" if result.path else f"messages[{index}]"
            located = Rejection(result.code, path, result.detail)
            found.append(Rejected(located, orjson.dumps(element)))
        else:
            found.append(result)
    return found


def _raw(data: bytes | bytearray | memoryview | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)

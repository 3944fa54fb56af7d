"""One Kafka record (or one line of a file) into its v1 messages, each valid or rejected.

A record is one message, or a ``collectives`` batch of one job's collective messages from
one node. A batch is taken apart here: an invalid element is rejected alone, with its own
field path (``messages[3].rank``) and its own JSON as the dead letter's payload, and every
other element is taken; only a broken envelope (not JSON, no job, ``messages`` not an
array...) rejects the whole record. A batch without messages that names its node is kept
as that envelope: the node's agent is up (its presence). Every reader of the collective
topic (the streams worker, ``c4 diagnose``, ``c4 validate``) goes through `decode_record`.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from schemas.messages import MAX_BATCH_MESSAGES, Collective, Collectives, not_the_batch_job
from schemas.topics import TOPICS_BY_KIND

BATCH_KIND = "collectives"
ELEMENT_KIND = "collective"


@dataclass(frozen=True, slots=True)
class Rejected:
    """One rejected message of a record and what its dead letter carries."""

    rejection: Rejection
    payload: bytes  # the rejected element's JSON, or the whole record's bytes

    @property
    def reason(self) -> str:
        """The rejection's one line."""
        return self.rejection.reason


def accepts_batch(kind: str | None) -> bool:
    """Whether a reader of ``kind`` (None: any) also takes that kind's batches."""
    if kind is None or kind == BATCH_KIND:
        return True
    topic = TOPICS_BY_KIND.get(kind)
    return topic is not None and topic.batch_kind == BATCH_KIND


def decode_record(
    data: bytes | bytearray | memoryview | str, kind: str | None = None
) -> list[C4Model | Rejected]:
    """The messages of one record, in order: models, and `Rejected` for the invalid ones.

    ``kind`` names what the reader expects (e.g. the topic's kind); ``collective`` also
    takes ``collectives`` batches, ``collectives`` takes batches only, None takes anything.
    """
    size = len(data)
    if size > MAX_MESSAGE_BYTES:
        detail = f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}"
        return [Rejected(Rejection(RejectCode.TOO_LARGE, "", detail), _raw(data))]
    batch_ok = accepts_batch(kind)
    if batch_ok or kind == "link":
        fast = decode_hot_batch(data, kind)
        if fast is not None:
            return list(fast)
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        return [Rejected(invalid_json(error), _raw(data))]
    if batch_ok and isinstance(obj, dict) and obj.get("kind") == BATCH_KIND and obj.get("v") == 1:
        return _batch(obj, _raw(data))
    result = decode_object(obj, BATCH_KIND if kind == BATCH_KIND else kind)
    if isinstance(result, Rejection):
        return [Rejected(result, _raw(data))]
    return [result]


def _batch(obj: dict[str, Any], raw: bytes) -> list[C4Model | Rejected]:
    """A batch the fast path did not take whole: its envelope, then element by element."""
    if "messages" not in obj:
        missing = Rejection(RejectCode.MISSING_FIELD, "messages", "required field missing")
        return [Rejected(missing, raw)]
    elements = obj["messages"]
    envelope = decode_object({**obj, "messages": []}, BATCH_KIND)
    if isinstance(envelope, Rejection):
        return [Rejected(envelope, raw)]
    if not isinstance(elements, list) or len(elements) > MAX_BATCH_MESSAGES:
        # Not an array, or too long: the model says which, in the contract's words (it
        # cannot accept such a batch: its field is a bounded array).
        whole = decode_object(obj, BATCH_KIND)
        assert isinstance(whole, Rejection)  # noqa: S101
        return [Rejected(whole, raw)]
    if not elements and isinstance(envelope, Collectives) and envelope.node is not None:
        # No message, a node: that node's agent is up while the job's ranks on it said
        # nothing this interval (contract: collectives, presence).
        return [envelope]
    job = obj["job"]
    found: list[C4Model | Rejected] = []
    for index, element in enumerate(elements):
        result = decode_object(element, ELEMENT_KIND)
        if isinstance(result, Collective) and result.job != job:
            result = Rejection(RejectCode.INCONSISTENT, "job", not_the_batch_job(result.job, job))
        if isinstance(result, Rejection):
            path = f"messages[{index}].{result.path}" if result.path else f"messages[{index}]"
            located = Rejection(result.code, path, result.detail)
            found.append(Rejected(located, orjson.dumps(element)))
        else:
            found.append(result)
    return found


def _raw(data: bytes | bytearray | memoryview | str) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)

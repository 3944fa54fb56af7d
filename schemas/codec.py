"""The one orjson codec: encode a model; decode bytes into a model or a typed rejection."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from schemas.base import RULE_ERROR_TYPE, C4Model
from schemas.fastpath import decode_hot
from schemas.files import Flows, Plan, Topology
from schemas.messages import (
    Action,
    Collective,
    Collectives,
    Deadletter,
    Diagnosis,
    Gpu,
    Gpus,
    Job,
    Link,
    Links,
    Member,
    Neighbours,
    Route,
)
from schemas.topics import FABRIC_KEY, TOPICS_BY_KIND, KeyRule, reads_as

VERSION = 1
# Kafka's default message.max.bytes is ~1 MiB; anything far above it is not a v1 message.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Kept of a rejected payload in its dead letter (escaped, it may grow up to 4x in JSON).
MAX_DEADLETTER_PAYLOAD = 256 * 1024
# A v1 document nests 5 levels at most (a batch's messages' ops' arrays); far deeper is no
# v1 document, and is refused before anything walks it.
MAX_DEPTH = 32

MESSAGE_MODELS: dict[str, type[C4Model]] = {
    "collective": Collective,
    "collectives": Collectives,
    "link": Link,
    "links": Links,
    "neighbours": Neighbours,
    "gpu": Gpu,
    "gpus": Gpus,
    "job": Job,
    "member": Member,
    "diagnosis": Diagnosis,
    "action": Action,
    "route": Route,
    "deadletter": Deadletter,
}
FILE_MODELS: dict[str, type[C4Model]] = {"topology": Topology, "flows": Flows, "plan": Plan}
MODELS: dict[str, type[C4Model]] = MESSAGE_MODELS | FILE_MODELS
KINDS: tuple[str, ...] = tuple(MODELS)


class RejectCode(StrEnum):
    """The closed set of reasons an input is rejected."""

    TOO_LARGE = "too_large"
    TOO_DEEP = "too_deep"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    BAD_VERSION = "bad_version"
    UNKNOWN_KIND = "unknown_kind"
    WRONG_KIND = "wrong_kind"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    BAD_VALUE = "bad_value"
    INCONSISTENT = "inconsistent"
    PROCESSING_FAILED = "processing_failed"


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an input is not a valid v1 message: a code, the field path, what is wrong."""

    code: RejectCode
    path: str
    detail: str

    @property
    def reason(self) -> str:
        """One line: ``<field path>: <what is wrong>`` (no path for whole-input problems)."""
        return f"{self.path}: {self.detail}" if self.path else self.detail


def encode(message: C4Model) -> bytes:
    """The message as compact UTF-8 JSON, optional fields left out when unset."""
    return orjson.dumps(message.model_dump(by_alias=True))


def decode(
    data: bytes | bytearray | memoryview | str, kind: str | None = None
) -> C4Model | Rejection:
    """Decode one JSON document into its v1 model, or a `Rejection` (never raises on input).

    ``kind`` names the kind the caller expects (e.g. from the topic); without it the
    document's own ``kind`` field chooses the model.
    """
    size = len(data)
    if size > MAX_MESSAGE_BYTES:
        return Rejection(
            RejectCode.TOO_LARGE, "", f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}"
        )
    fast = decode_hot(data, kind)
    if fast is not None:
        return fast
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        return invalid_json(error)
    return decode_object(obj, kind)


def invalid_json(error: orjson.JSONDecodeError) -> Rejection:
    """The rejection of bytes orjson cannot parse (past its own nesting bound: too deep)."""
    if "depth limit" in str(error):
        return too_deep()
    return Rejection(RejectCode.INVALID_JSON, "", f"invalid JSON: {error}")


def decode_object(obj: Any, kind: str | None = None) -> C4Model | Rejection:
    """Validate an already parsed JSON value as a v1 model, or say why it is not one."""
    if not isinstance(obj, dict):
        return Rejection(
            RejectCode.NOT_AN_OBJECT, "", f"expected a JSON object, got {_json_type(obj)}"
        )
    if nested_deeper_than(obj, MAX_DEPTH):
        return too_deep()
    version = obj.get("v")
    if type(version) is not int or version != VERSION:
        if "v" not in obj:
            return Rejection(RejectCode.MISSING_FIELD, "v", "required field missing")
        return Rejection(
            RejectCode.BAD_VERSION, "v", f"unsupported version {_show(version)}, expected 1"
        )
    found = obj.get("kind")
    if "kind" not in obj:
        return Rejection(RejectCode.MISSING_FIELD, "kind", "required field missing")
    if not isinstance(found, str) or found not in MODELS:
        return Rejection(RejectCode.UNKNOWN_KIND, "kind", f"unknown kind {_show(found)}")
    if kind is not None and not reads_as(found, kind):
        return Rejection(RejectCode.WRONG_KIND, "kind", f"expected {kind!r}, got {found!r}")
    try:
        return MODELS[found].model_validate(obj)
    except ValidationError as error:
        return _rejection_from(error)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests arrays and objects more than ``limit`` levels.

    Walked with an explicit stack, never by recursion: the value is untrusted, and orjson
    parses up to 1,024 levels.
    """
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        children = current.values() if isinstance(current, dict) else current
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def too_deep() -> Rejection:
    """The rejection of a document nested past `MAX_DEPTH`."""
    return Rejection(RejectCode.TOO_DEEP, "", f"nested deeper than {MAX_DEPTH} levels")


def _rejection_from(error: ValidationError) -> Rejection:
    details = error.errors(include_url=False)
    first = details[0]
    rejection = _rejection_from_detail(first)
    if len(details) > 1:
        more = f" (and {len(details) - 1} more)"
        return Rejection(rejection.code, rejection.path, rejection.detail + more)
    return rejection


def _rejection_from_detail(detail: ErrorDetails) -> Rejection:
    path = _path(detail["loc"])
    kind = detail["type"]
    if kind == RULE_ERROR_TYPE:
        context = detail.get("ctx") or {}
        below = str(context.get("path", ""))
        full = f"{path}.{below}" if path and below else path or below
        return Rejection(RejectCode.INCONSISTENT, full, str(context.get("detail", "")))
    if kind == "missing":
        return Rejection(RejectCode.MISSING_FIELD, path, "required field missing")
    got = _show(detail.get("input"))
    # Pydantic says "Input should be ..." or "String should have ...": keep from "should".
    message = detail["msg"].removeprefix("Value error, ")
    start = message.find("should ")
    message = message[start:] if start >= 0 else message
    code = RejectCode.WRONG_TYPE if kind.endswith("_type") else RejectCode.BAD_VALUE
    if kind.endswith("_type"):
        got = _json_type(detail.get("input"))
    return Rejection(code, path, f"{message}, got {got}")


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {_show(value)}"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def key_of(message: C4Model) -> str:
    """The Kafka key of a v1 message, by the topic registry's key rule."""
    kind = getattr(message, "kind", "")
    topic = TOPICS_BY_KIND.get(kind)
    if topic is None:
        error = f"kind {kind!r} is not sent on a topic"
        raise ValueError(error)
    rule = topic.key
    if rule is KeyRule.JOB_OR_FABRIC:
        job = getattr(message, "job", None)
        return job if isinstance(job, str) else FABRIC_KEY
    field = {KeyRule.JOB: "job", KeyRule.NODE: "node", KeyRule.TARGET: "target"}.get(rule)
    if field is None:
        error = f"kind {kind!r} is keyed by the rejected message's key; pass it explicitly"
        raise ValueError(error)
    return str(getattr(message, field))


def dead_letter(
    topic: str, payload: bytes | bytearray | str, rejection: Rejection, ts_ns: int
) -> Deadletter:
    """The dead letter for a rejected input: its topic, reason and original bytes as text.

    A payload over `MAX_DEADLETTER_PAYLOAD` characters (a message rejected as too large)
    is cut there and says so: the dead letter itself must stay a readable v1 message.
    """
    text = (
        payload
        if isinstance(payload, str)
        else bytes(payload).decode("utf-8", errors="backslashreplace")
    )
    if len(text) > MAX_DEADLETTER_PAYLOAD:
        text = f"{text[:MAX_DEADLETTER_PAYLOAD]}... [cut: {len(text)} characters in all]"
    return Deadletter(
        v=1, kind="deadletter", topic=topic, ts_ns=ts_ns, error=rejection.reason, payload=text
    )

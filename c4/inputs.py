"""Reading the input files of the offline commands, with one-line errors.

v1 files are decoded with the codec's validation but not its size limit: that limit is
for Kafka messages, and the topology of a large cluster is a file of several MiB.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any, TypeVar

import orjson

from c4 import C4Error
from schemas.base import C4Model
from schemas.codec import MAX_MESSAGE_BYTES, Rejection, decode_object
from streams.core.params import DetectorParams, ParamsError, params_from_document

Model = TypeVar("Model", bound=C4Model)
# A v1 document (the topology of a large cluster is several MiB) is read whole up to this.
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024


class InputError(C4Error):
    """An input file cannot be read (exit 2) or is not the document expected (exit 1)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def read_input(path: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of a file of at most ``limit`` bytes of text, or an `InputError` naming it
    (exit 2 when it cannot be read, 1 when it is binary or too large).

    Read in chunks, so a device that never ends (``/dev/zero``) or a huge file is refused
    before it fills memory.
    """
    parts: list[bytes] = []
    size = 0
    try:
        with open(path, "rb") as stream:
            while chunk := stream.read(CHUNK_BYTES):
                _refuse_binary(path, chunk)
                size += len(chunk)
                if size > limit:
                    message = f"{path}: larger than {limit} bytes"
                    raise InputError(message)
                parts.append(chunk)
    except OSError as error:
        message = f"cannot read {path}: {error.strerror or error}"
        raise InputError(message, 2) from None
    return b"".join(parts)


def json_lines(
    stream: IO[bytes], name: str, limit: int = MAX_MESSAGE_BYTES
) -> Iterator[tuple[int, bytes | None]]:
    """Each line of a JSON Lines stream with its number, in memory bounded by ``limit``.

    A line longer than ``limit`` bytes comes as None (the caller rejects it) and is skipped
    without being held; a NUL byte (never in JSON text: binary input such as ``/dev/zero``)
    ends the reading with an `InputError`. Read as the bytes arrive (a pipe is followed).
    """
    read = getattr(stream, "read1", stream.read)
    number = 0
    pending: list[bytes] = []
    held = 0  # bytes of the current line held so far
    skipping = False  # the current line is over the limit: its bytes are dropped
    while chunk := read(CHUNK_BYTES):
        _refuse_binary(name, chunk)
        pieces = chunk.split(b"\n")
        for piece in pieces[:-1]:
            number += 1
            if skipping or held + len(piece) > limit:
                yield number, None
            else:
                yield number, b"".join((*pending, piece)) if pending else piece
            pending, held, skipping = [], 0, False
        tail = pieces[-1]
        if not skipping and tail:
            held += len(tail)
            if held > limit:
                pending, held, skipping = [], 0, True
            else:
                pending.append(tail)
    if skipping:
        yield number + 1, None
    elif pending:
        yield number + 1, b"".join(pending)


def overlong_line(limit: int = MAX_MESSAGE_BYTES) -> str:
    """The reason a line over ``limit`` bytes is rejected (as a message over it would be)."""
    return f"line over {limit} bytes (skipped)"


def _refuse_binary(name: str, chunk: bytes) -> None:
    """An `InputError` when a chunk holds a NUL byte."""
    if b"\0" in chunk:
        message = f"{name}: binary data (a NUL byte), not JSON text"
        raise InputError(message)


def load_document(path: str, kind: str, model: type[Model]) -> Model:
    """Read and decode one v1 file (topology, flows, ...), or an `InputError`."""
    try:
        obj = orjson.loads(read_input(path))
    except orjson.JSONDecodeError as error:
        message = f"{path}: invalid JSON: {error}"
        raise InputError(message) from None
    result = decode_object(obj, kind)
    if isinstance(result, Rejection):
        message = f"{path}: {result.reason}"
        raise InputError(message)
    if not isinstance(result, model):  # decode_object chose the model by kind
        message = f"{path}: not a {kind} file"
        raise InputError(message)
    return result


def load_params(path: str) -> tuple[DetectorParams, dict[str, dict[str, Any]]]:
    """A detector parameters file (`streams.core.params.params_from_document`), or an
    `InputError` naming what is wrong."""
    try:
        return params_from_document(orjson.loads(read_input(path)))
    except (orjson.JSONDecodeError, ParamsError, OverflowError) as error:
        message = f"{path}: {error}"
        raise InputError(message) from error

"""Reading the input files of the offline commands, with one-line errors.

v1 files are decoded with the codec's validation but not its size limit: that limit is
for Kafka messages, and the topology of a large cluster is a file of several MiB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import orjson

from c4 import C4Error
from schemas.base import C4Model
from schemas.codec import Rejection, decode_object
from streams.core.params import DetectorParams, ParamsError, params_from_document

Model = TypeVar("Model", bound=C4Model)


class InputError(C4Error):
    """An input file cannot be read (exit 2) or is not the document expected (exit 1)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def read_input(path: str) -> bytes:
    """The bytes of a file, or an `InputError` naming it (exit 2)."""
    try:
        return Path(path).read_bytes()
    except OSError as error:
        message = f"cannot read {path}: {error.strerror or error}"
        raise InputError(message, 2) from None


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

"""Reading PyTorch Flight Recorder dumps (one pickle per rank) safely.

A dump is a pickle of plain data (NOTES.md): ``pg_config`` (global process-group name ->
its member ranks), ``entries`` (one per recorded operation: ``process_group`` = (global
name, description), ``collective_seq_id``, ``profiling_name`` like ``nccl:all_reduce`` or
``nccl:send 3->0``, ``time_created_ns``, ``time_discovered_completed_ns``, ``state``, sizes).
It is unpickled with an unpickler that refuses every class and global: a dump that tries to
build any object other than plain data is rejected before anything runs. The file name ends
with the rank that wrote it; its modification time is when it was written.
"""

from __future__ import annotations

import io
import pickle
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from producers import ProducerError

MAX_DUMP_BYTES = 512 << 20
_RANK_SUFFIX = re.compile(r"(\d+)$")


class FlightRecorderError(ProducerError):
    """A Flight Recorder dump cannot be read or converted."""


class _PlainUnpickler(pickle._Unpickler):
    """Builds only what pickle builds without a global: dicts, lists, tuples, str, numbers.

    The pure-Python unpickler, not the C one: the C one sizes its memo by the largest index
    a PUT names, so 28 bytes naming index 10^9 allocate 8 GiB (found by the atheris fuzzer,
    tests/fuzz); here the memo is a dict. About 20 us per entry, a dump is at most thousands.
    """

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self._size = len(data)

    def find_class(self, module: str, name: str) -> Any:
        message = f"refers to {module}.{name}; only plain data is accepted"
        raise FlightRecorderError(message)

    def load_bytearray8(self) -> None:
        """BYTEARRAY8, but a length the pickle cannot hold is refused before the buffer is
        allocated (pickle's own allocates first: 650 bytes claiming 11 GB ran a fuzzer out of
        memory)."""
        unpickler: Any = self  # read, readinto and append are set up by load()
        (size,) = struct.unpack("<Q", unpickler.read(8))
        if size > self._size:
            message = f"a {size}-byte bytearray in a {self._size}-byte pickle"
            raise pickle.UnpicklingError(message)
        buffer = bytearray(size)
        unpickler.readinto(buffer)
        unpickler.append(buffer)

    dispatch: ClassVar[dict[int, Any]] = {
        **pickle._Unpickler.dispatch,
        pickle.BYTEARRAY8[0]: load_bytearray8,
    }


def load_dump(data: bytes, source: str) -> dict[str, Any]:
    """Unpickle one dump with no class allowed; a one-line error naming ``source``."""
    if len(data) > MAX_DUMP_BYTES:
        message = f"{source}: {len(data)} bytes, more than a dump can be ({MAX_DUMP_BYTES})"
        raise FlightRecorderError(message)
    try:
        dump = _PlainUnpickler(data).load()
    except FlightRecorderError as error:
        message = f"{source}: rejected: the pickle {error}"
        raise FlightRecorderError(message) from None
    except Exception as error:  # noqa: BLE001 -- any unpickling failure is bad input
        message = (
            f"{source}: not a Flight Recorder pickle ({type(error).__name__}: {short_text(error)})"
        )
        raise FlightRecorderError(message) from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        message = f"{source}: not a Flight Recorder dump (no 'entries' list)"
        raise FlightRecorderError(message)
    return dump


def is_dump_name(name: str) -> bool:
    """Whether a file name is a dump's (it ends with a rank number)."""
    return _RANK_SUFFIX.search(name) is not None


def rank_of(path: Path) -> int:
    """The global rank that wrote a dump: the number its file name ends with."""
    match = _RANK_SUFFIX.search(path.name)
    if match is None:
        message = f"{path}: the file name does not end with the rank"
        raise FlightRecorderError(message)
    return int(match.group(1))


@dataclass(frozen=True, slots=True)
class RankDump:
    """One rank's dump: who wrote it, when, and what it holds."""

    rank: int
    written_ns: int
    dump: dict[str, Any]
    source: str


def read_dump_file(path: Path) -> RankDump:
    """Read one dump file (rank from its name, time from its modification time)."""
    try:
        data = path.read_bytes()
        written_ns = path.stat().st_mtime_ns
    except OSError as error:
        message = f"{path}: cannot read ({error.strerror or error})"
        raise FlightRecorderError(message) from None
    return RankDump(rank_of(path), written_ns, load_dump(data, str(path)), str(path))


def read_dump_folder(folder: Path) -> list[RankDump]:
    """Every dump in a folder (files whose name ends with a rank number)."""
    if not folder.is_dir():
        message = f"{folder}: not a folder"
        raise FlightRecorderError(message)
    paths = [p for p in sorted(folder.iterdir()) if p.is_file() and is_dump_name(p.name)]
    if not paths:
        message = f"{folder}: no dump files (names ending with the rank number)"
        raise FlightRecorderError(message)
    return [read_dump_file(path) for path in paths]


def short_text(error: Exception, limit: int = 120) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""Reading PyTorch Flight Recorder dumps (one pickle per rank) safely.

A dump is a pickle of plain data (NOTES.md): ``pg_config`` (global process-group name ->
its member ranks), ``entries`` (one per recorded operation: ``process_group`` = (global
name, description), ``collective_seq_id``, ``profiling_name`` like ``nccl:all_reduce`` or
``nccl:send 3->0``, ``time_created_ns``, ``time_discovered_completed_ns``, ``state``, sizes).
It is unpickled with an unpickler that refuses every class and global: a dump that tries to
build any object other than plain data is rejected before anything runs. The file name ends
with the rank that wrote it; its modification time is when it was written.

A pickle's memo lets a small file refer to one object many times (2,000 references to one
20,000-dimension shape fit in 204 KB), so what a dump holds is bounded by count, not by its
size: entries, process groups and the ranks they list, tensor shapes and their dimensions
(`bounds_problem`), and tuples nested in tuples (hashing one recurses in C, without Python's
recursion limit: a key nested 200,000 deep crashed the process).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from producers import ProducerError
from producers.bounded_read import MAX_NESTING

MAX_DUMP_BYTES = 512 << 20
# Torch keeps 2,000 entries by default (TORCH_FR_BUFFER_SIZE); far more is not a dump.
MAX_ENTRIES = 1 << 18
MAX_GROUPS = 1 << 16
# Characters (of a "[0, 1, ...]" string) or items (of a list) of every group's ranks: a
# 100,000-rank world lists 700,000 characters.
MAX_CONFIG_RANKS = 1 << 23
# Tensor shapes in all the entries' input and output sizes, and their dimensions in all.
MAX_SHAPES = 1 << 21
MAX_SHAPE_DIMS = 1 << 23
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
        # id -> how many tuples deep, for each tuple built deeper than 1 (ids of live
        # tuples only are looked up: each was entered when it was built).
        self._tuple_depth: dict[int, int] = {}

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

    def _check_tuple_depth(self) -> None:
        """The tuple just built is at most `MAX_NESTING` tuples deep (hashing recurses)."""
        unpickler: Any = self
        built = unpickler.stack[-1]
        depth = 1 + max(
            (self._tuple_depth.get(id(item), 1) for item in built if type(item) is tuple),
            default=0,
        )
        if depth > MAX_NESTING:
            message = f"has tuples nested deeper than {MAX_NESTING} levels"
            raise FlightRecorderError(message)
        if depth > 1:
            self._tuple_depth[id(built)] = depth

    def load_tuple(self) -> None:
        """TUPLE, its depth checked."""
        pickle._Unpickler.load_tuple(self)  # type: ignore[attr-defined]
        self._check_tuple_depth()

    def load_tuple1(self) -> None:
        """TUPLE1, its depth checked."""
        pickle._Unpickler.load_tuple1(self)  # type: ignore[attr-defined]
        self._check_tuple_depth()

    def load_tuple2(self) -> None:
        """TUPLE2, its depth checked."""
        pickle._Unpickler.load_tuple2(self)  # type: ignore[attr-defined]
        self._check_tuple_depth()

    def load_tuple3(self) -> None:
        """TUPLE3, its depth checked."""
        pickle._Unpickler.load_tuple3(self)  # type: ignore[attr-defined]
        self._check_tuple_depth()

    dispatch: ClassVar[dict[int, Any]] = {
        **pickle._Unpickler.dispatch,
        pickle.BYTEARRAY8[0]: load_bytearray8,
        pickle.TUPLE[0]: load_tuple,
        pickle.TUPLE1[0]: load_tuple1,
        pickle.TUPLE2[0]: load_tuple2,
        pickle.TUPLE3[0]: load_tuple3,
    }


def load_dump(data: bytes, source: str) -> dict[str, Any]:
    """Unpickle one dump with no class allowed; a one-line error naming ``source``."""
    if len(data) > MAX_DUMP_BYTES:
        message = f"{source}: over {MAX_DUMP_BYTES} bytes, more than a dump can be"
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
    problem = bounds_problem(dump)
    if problem is not None:
        message = f"{source}: rejected: {problem}"
        raise FlightRecorderError(message)
    return dump


def bounds_problem(dump: Mapping[str, Any]) -> str | None:
    """Why a dump holds more than a dump can, or None.

    Counted with len() and stopped at the first count over its bound, so the check costs at
    most the bounds however often the pickle refers to one object.
    """
    entries = dump["entries"]
    if len(entries) > MAX_ENTRIES:
        return f"{len(entries)} entries (at most {MAX_ENTRIES})"
    config = dump.get("pg_config")
    if isinstance(config, Mapping):
        if len(config) > MAX_GROUPS:
            return f"{len(config)} process groups in pg_config (at most {MAX_GROUPS})"
        listed = 0
        for group in config.values():
            ranks = group.get("ranks") if isinstance(group, Mapping) else None
            listed += len(ranks) if isinstance(ranks, str | list | tuple) else 0
            if listed > MAX_CONFIG_RANKS:
                return f"pg_config lists over {MAX_CONFIG_RANKS} ranks (or characters) in all"
    shapes = dims = 0
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        for key in ("input_sizes", "output_sizes"):
            sizes = entry.get(key)
            if not isinstance(sizes, list | tuple):
                continue
            shapes += len(sizes)
            if shapes > MAX_SHAPES:
                return f"the entries hold over {MAX_SHAPES} tensor shapes in all"
            dims += sum(len(shape) for shape in sizes if isinstance(shape, list | tuple))
            if dims > MAX_SHAPE_DIMS:
                return f"the entries' tensor shapes have over {MAX_SHAPE_DIMS} dimensions in all"
    return None


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
        with path.open("rb") as stream:
            written_ns = os.fstat(stream.fileno()).st_mtime_ns
            data = stream.read(MAX_DUMP_BYTES + 1)  # one byte more tells it is too big
    except OSError as error:
        message = f"{path}: cannot read ({error.strerror or error})"
        raise FlightRecorderError(message) from None
    return RankDump(rank_of(path), written_ns, load_dump(data, str(path)), str(path))


def read_dump_folder(folder: Path, bad_files: list[str] | None = None) -> list[RankDump]:
    """Every dump in a folder (files whose name ends with a rank number).

    A file that is not a readable dump raises, or with ``bad_files`` is left out and
    described there in one line, so that the other ranks' dumps are still read.
    """
    if not folder.is_dir():
        message = f"{folder}: not a folder"
        raise FlightRecorderError(message)
    paths = [p for p in sorted(folder.iterdir()) if p.is_file() and is_dump_name(p.name)]
    if not paths:
        message = f"{folder}: no dump files (names ending with the rank number)"
        raise FlightRecorderError(message)
    dumps: list[RankDump] = []
    for path in paths:
        try:
            dumps.append(read_dump_file(path))
        except FlightRecorderError as error:
            if bad_files is None:
                raise
            bad_files.append(str(error))
    return dumps


def short_text(error: Exception, limit: int = 120) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""PyTorch Flight Recorder dumps (one pickle per rank) as v1 collective messages.

A dump is a pickle of plain data (NOTES.md): ``pg_config`` (global process-group name ->
its member ranks), ``entries`` (one per recorded operation: ``process_group`` = (global
name, description), ``collective_seq_id``, ``profiling_name`` like ``nccl:all_reduce`` or
``nccl:send 3->0``, ``time_created_ns``, ``time_discovered_completed_ns``, ``state``, sizes).
It is unpickled with an unpickler that refuses every class and global: a dump that tries to
build any object other than plain data is rejected before anything runs.

The messages rebuild what a live agent would have sent from that rank: one message per
communicator per interval from the rank's first recorded operation up to the moment it
wrote the dump (the file's modification time), each operation reported when it was entered
(``end_ns`` null while in flight) and again when it completed. Point-to-point operations go
to the pair's own communicator (``<name>:p2p:<lo>-<hi>``) with a per-pair ``seq``.
Completed operations without a completion time (gloo records none) get ``end_ns`` =
``enter_ns``: they finished, when is unknown.
"""

from __future__ import annotations

import ast
import io
import pickle
import re
import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from producers import ProducerError
from producers.sources import Reading
from schemas.base import MAX_ID_CHARS, MAX_ITEMS
from schemas.messages import Collective, OpName, Ops, RankPlace

NS_PER_S = 1_000_000_000
MAX_DUMP_BYTES = 512 << 20
# Heartbeats go back at most this many intervals before a timeline's end (an hour at 1 s):
# older operations are reported in its first message. Bounds the output of a dump whose
# entries span days (or claim a creation time of 0).
MAX_INTERVALS = 3_600
MAX_INT64 = 2**63 - 1
# Element sizes of the dtype names a dump uses ("Float", "BFloat16", ...), lower-cased.
DTYPE_BYTES = {
    "float": 4,
    "half": 2,
    "bfloat16": 2,
    "double": 8,
    "long": 8,
    "int": 4,
    "short": 2,
    "byte": 1,
    "char": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
_RANK_SUFFIX = re.compile(r"(\d+)$")
_P2P = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+|\?)$")


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
            f"{source}: not a Flight Recorder pickle ({type(error).__name__}: {_short(error)})"
        )
        raise FlightRecorderError(message) from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        message = f"{source}: not a Flight Recorder dump (no 'entries' list)"
        raise FlightRecorderError(message)
    return dump


def rank_of(path: Path) -> int:
    """The global rank that wrote a dump: the number its file name ends with."""
    match = _RANK_SUFFIX.search(path.name)
    if match is None:
        message = f"{path}: the file name does not end with the rank"
        raise FlightRecorderError(message)
    return int(match.group(1))


def op_name(profiling_name: str) -> tuple[OpName | None, str]:
    """The contract's op for a profiling name (``nccl:_all_gather_base``) and the rest."""
    _, _, name = str(profiling_name).rpartition(":")
    word, _, rest = name.strip().partition(" ")
    compact = word.strip("_").replace("_", "").lower()
    table: tuple[tuple[str, OpName], ...] = (
        ("allreduce", "allreduce"),
        ("allgather", "allgather"),
        ("reducescatter", "reducescatter"),
        ("alltoall", "alltoall"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("send", "send"),
        ("recv", "recv"),
        ("reduce", "reduce"),
    )
    for prefix, op in table:
        if compact.startswith(prefix):
            return op, rest.strip()
    return None, rest.strip()


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
    paths = [p for p in sorted(folder.iterdir()) if p.is_file() and _RANK_SUFFIX.search(p.name)]
    if not paths:
        message = f"{folder}: no dump files (names ending with the rank number)"
        raise FlightRecorderError(message)
    return [read_dump_file(path) for path in paths]


def _members_from_config(dump: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    members: dict[str, tuple[int, ...]] = {}
    config = dump.get("pg_config")
    if not isinstance(config, Mapping):
        return members
    for key, value in config.items():
        if not isinstance(value, Mapping):
            continue
        ranks = value.get("ranks")
        try:
            parsed: Any = ast.literal_eval(ranks) if isinstance(ranks, str) else ranks
            group = tuple(int(rank) for rank in parsed or ())
        except (ValueError, TypeError, SyntaxError, OverflowError, MemoryError, RecursionError):
            continue
        if any(not 0 <= rank <= MAX_INT64 for rank in group) or len(set(group)) != len(group):
            continue
        name = value.get("name") or key
        if group and name:
            members[str(name)] = group
    return members


@dataclass(slots=True)
class _Op:
    seq: int
    op: OpName
    nbytes: int
    enter_ns: int
    end_ns: int | None


@dataclass(slots=True)
class Conversion:
    """The messages of a conversion and what was skipped (one line each)."""

    messages: list[Collective] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _numel_bytes(sizes: Any, dtypes: Any) -> int:
    total = 0
    if not isinstance(sizes, list):
        return 0
    dtype_list = dtypes if isinstance(dtypes, list) else []
    for index, shape in enumerate(sizes):
        count = 1
        for dim in shape if isinstance(shape, list) else []:
            count *= int(dim) if isinstance(dim, int) and dim >= 0 else 0
        dtype = str(dtype_list[index]).lower() if index < len(dtype_list) else "float"
        total += count * DTYPE_BYTES.get(dtype, 4)
    return total


def convert(
    dumps: Iterable[RankDump],
    job: str,
    places: Mapping[int, RankPlace] | None = None,
    interval_ns: int = NS_PER_S,
) -> Conversion:
    """v1 collective messages of every rank's dump."""
    dumps = list(dumps)
    members = {}
    for rank_dump in dumps:
        members.update(_members_from_config(rank_dump.dump))
    # Groups the config does not describe: members are the ranks whose dumps hold them.
    seen_in: dict[str, set[int]] = defaultdict(set)
    for rank_dump in dumps:
        for entry in rank_dump.dump["entries"]:
            group = entry.get("process_group") if isinstance(entry, Mapping) else None
            if isinstance(group, list | tuple) and group:
                seen_in[str(group[0])].add(rank_dump.rank)
    for name, ranks in seen_in.items():
        if name not in members or not set(ranks) <= set(members[name]):
            members[name] = tuple(sorted(ranks | set(members.get(name, ()))))
    result = Conversion()
    for rank_dump in dumps:
        timelines = _timelines(rank_dump, members, result.skipped)
        place = (places or {}).get(rank_dump.rank)
        for (comm, size, comm_rank), ops in timelines.items():
            try:
                result.messages.extend(
                    _interval_messages(
                        job, comm, size, comm_rank, rank_dump, ops, place, interval_ns
                    )
                )
            except ValidationError as error:
                first = error.errors(include_url=False)[0]
                where = ".".join(str(part) for part in first["loc"])
                result.skipped.append(
                    f"{rank_dump.source} process group {_short_repr(comm)}: not converted"
                    f" ({where}: {first['msg']})"
                )
    result.messages.sort(key=lambda message: message.ts_ns)
    return result


def _timelines(
    rank_dump: RankDump, members: Mapping[str, tuple[int, ...]], skipped: list[str]
) -> dict[tuple[str, int, int], list[_Op]]:
    """Per (communicator, size, rank in it): this rank's operations in order."""
    me = rank_dump.rank
    timelines: dict[tuple[str, int, int], list[_Op]] = defaultdict(list)
    pair_seq: dict[str, int] = defaultdict(int)
    status = rank_dump.dump.get("pg_status")
    for index, entry in enumerate(rank_dump.dump["entries"]):
        where = f"{rank_dump.source} entry {index}"
        try:
            name = str(entry["process_group"][0])
            op, rest = op_name(str(entry["profiling_name"]))
            enter = int(entry["time_created_ns"])
            seq = int(entry.get("collective_seq_id", 0))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as error:
            skipped.append(f"{where}: malformed ({type(error).__name__}: {_short(error)})")
            continue
        if not (0 <= enter <= MAX_INT64 and 0 <= seq <= MAX_INT64):
            skipped.append(f"{where}: time_created_ns or collective_seq_id out of range")
            continue
        if not name or len(name) > MAX_ID_CHARS - 48:
            skipped.append(f"{where}: process group name {_short_repr(name)} empty or too long")
            continue
        if op is None:
            skipped.append(
                f"{where}: {_short_repr(entry.get('profiling_name'))} is not a v1 operation"
            )
            continue
        group = members.get(name, ())
        if me not in group:
            skipped.append(
                f"{where}: rank {me} is not a member of process group {_short_repr(name)}"
            )
            continue
        end = _end_ns(entry, enter, status)
        nbytes = _numel_bytes(entry.get("input_sizes"), entry.get("input_dtypes"))
        if (end is not None and end > MAX_INT64) or nbytes > MAX_INT64:
            skipped.append(f"{where}: completion time or size out of range")
            continue
        if op in ("send", "recv"):
            peer = _peer(op, rest, group)
            if peer is None:
                skipped.append(f"{where}: point-to-point peer unknown ({_short_repr(rest)})")
                continue
            low, high = sorted((me, peer))
            comm = f"{name}:p2p:{low}-{high}"
            pair_seq[comm] += 1
            timelines[(comm, 2, 0 if me == low else 1)].append(
                _Op(pair_seq[comm], op, nbytes, enter, end)
            )
        else:
            timelines[(name, len(group), group.index(me))].append(_Op(seq, op, nbytes, enter, end))
    return timelines


def _end_ns(entry: Mapping[str, Any], enter: int, status: Any) -> int | None:
    completed = entry.get("time_discovered_completed_ns")
    if isinstance(completed, int):
        return max(completed, enter)
    if entry.get("state") == "completed" or entry.get("retired") is True:
        return enter  # finished; the dump does not say when
    pg_status = status.get(str(entry.get("pg_id"))) if isinstance(status, Mapping) else None
    if isinstance(pg_status, Mapping) and not entry.get("is_p2p"):
        last = pg_status.get("last_completed_collective")
        if isinstance(last, int) and int(entry.get("collective_seq_id", 0)) <= last:
            return enter
    return None


def _short(error: Exception, limit: int = 120) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _peer(op: str, rest: str, group: tuple[int, ...]) -> int | None:
    """The peer's global rank: ``send a->b`` and ``recv a<-b`` name it (b) in group ranks."""
    match = _P2P.match(f"{op} {rest}")
    if match is None or match.group(4) == "?":
        return None
    local = int(match.group(4))
    ordered = sorted(group)
    return ordered[local] if local < len(ordered) else None


def _interval_messages(
    job: str,
    comm: str,
    size: int,
    comm_rank: int,
    rank_dump: RankDump,
    ops: list[_Op],
    place: RankPlace | None,
    interval_ns: int,
) -> list[Collective]:
    """The messages a live agent would have sent for one rank and communicator."""
    if not ops:
        return []
    ops = sorted(ops, key=lambda op: op.enter_ns)
    stop = max(rank_dump.written_ns, max(op.end_ns or op.enter_ns for op in ops))
    messages: list[Collective] = []
    start = max(ops[0].enter_ns, stop - MAX_INTERVALS * interval_ns)
    ts = start - start % interval_ns + interval_ns
    next_index = 0
    open_ops: list[_Op] = []
    while True:
        chosen = [op for op in open_ops if op.end_ns is not None and op.end_ns < ts]
        open_ops = [op for op in open_ops if op not in chosen]
        while next_index < len(ops) and ops[next_index].enter_ns < ts:
            op = ops[next_index]
            next_index += 1
            chosen.append(op)
            if op.end_ns is None or op.end_ns >= ts:
                open_ops.append(op)
        chosen.sort(key=lambda op: op.seq)
        for first in range(0, max(len(chosen), 1), MAX_ITEMS):
            part = chosen[first : first + MAX_ITEMS]
            messages.append(_message(job, comm, size, comm_rank, rank_dump.rank, ts, part, place))
        if ts >= stop:
            break
        ts += interval_ns
    return messages


def _message(
    job: str,
    comm: str,
    size: int,
    comm_rank: int,
    global_rank: int,
    ts_ns: int,
    ops: list[_Op],
    place: RankPlace | None,
) -> Collective:
    return Collective(
        v=1,
        kind="collective",
        job=job,
        comm=comm,
        comm_size=size,
        rank=comm_rank,
        global_rank=global_rank,
        node=place.node if place is not None else None,
        gpu=place.gpu if place is not None else None,
        ts_ns=ts_ns,
        ops=Ops(
            seq=tuple(op.seq for op in ops),
            op=tuple(op.op for op in ops),
            bytes=tuple(op.nbytes for op in ops),
            enter_ns=tuple(op.enter_ns for op in ops),
            end_ns=tuple(
                op.end_ns if op.end_ns is not None and op.end_ns < ts_ns else None for op in ops
            ),
        ),
    )


class FlightRecorderSource:
    """Watches a dump folder; each new or rewritten dump becomes that rank's messages."""

    def __init__(self, folder: Path, job: str, interval_s: float = 5.0) -> None:
        self.name = "flight-recorder"
        self.interval_s = interval_s
        self.folder, self.job = folder, job
        self._seen: dict[Path, int] = {}

    def read(self, now_ns: int) -> Reading:
        """Convert the dumps written since the last round."""
        del now_ns  # the messages carry the dump's own times
        reading = Reading()
        paths = sorted(self.folder.iterdir()) if self.folder.is_dir() else []
        for path in paths:
            if not path.is_file() or not _RANK_SUFFIX.search(path.name):
                continue
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                continue
            if self._seen.get(path) == mtime:
                continue
            self._seen[path] = mtime
            try:
                conversion = convert([read_dump_file(path)], self.job)
            except FlightRecorderError as error:
                reading.problems.append(str(error))
                continue
            reading.messages.extend(conversion.messages)
            reading.problems.extend(conversion.skipped)
        return reading

    def close(self) -> None:
        """Nothing is held open between rounds."""

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
to the pair's own communicator (``<name>:p2p:<lo>-<hi>``) with a per-pair ``seq``
(``_pair_seqs``; Flight Recorder's ``p2p_seq_id`` counts a rank's operations of the whole
group). Completed operations without a completion time (gloo records none) get ``end_ns`` =
``enter_ns``: they finished, when is unknown. A rank may have several dumps (one per
backend: torch keeps one recorder per backend name).
"""

from __future__ import annotations

import ast
import bisect
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
class _Entry:
    """One usable entry of one dump, before coalesced groups are merged."""

    file: int  # index of its dump in the conversion
    order: int  # record_id (position in the list if absent)
    thread: str
    group: str
    op: OpName | None  # None: the closing entry of a coalesced group ("nccl:coalesced")
    marker: bool  # closes a coalesced group ("coalesced", "allreduce_coalesced", ...)
    p2p: bool
    peer: int | None  # point-to-point: the peer's global rank
    seq: int  # collective_seq_id
    p2p_seq: int
    op_id: int
    nbytes: int
    enter_ns: int
    end_ns: int | None
    returned: bool  # retired, which here only says the call returned (see _trusts_retired)
    never_started: bool


@dataclass(slots=True)
class _PairOp:
    """A point-to-point operation of one side of a pair, in that side's order."""

    low_to_high: bool  # direction: the lower global rank sends
    op: _Op
    key: tuple[int, int, int]  # (p2p_seq_id, direction, index): equal on both sides of a pair
    #                            that is its whole process group


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


def _members(dumps: list[RankDump]) -> dict[str, tuple[int, ...]]:
    """Global group name -> member global ranks, in group-rank order."""
    members: dict[str, tuple[int, ...]] = {}
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
    return members


def convert(
    dumps: Iterable[RankDump],
    job: str,
    places: Mapping[int, RankPlace] | None = None,
    interval_ns: int = NS_PER_S,
) -> Conversion:
    """v1 collective messages of every rank's dump (a rank may have several: one per backend).

    Collectives are aligned across ranks by ``collective_seq_id``; point-to-point operations
    by each pair's own order (``_pair_seqs``), never by position in a dump, whose ring
    buffer may have dropped its oldest entries.
    """
    dumps = list(dumps)
    members = _members(dumps)
    result = Conversion()
    entries: list[_Entry] = []
    for file, rank_dump in enumerate(dumps):
        entries.extend(_entries(file, rank_dump, members, result.skipped))
    _infer_returned(entries, dumps)
    timelines: dict[tuple[str, int, int, int], list[_Op]] = defaultdict(list)
    stops: dict[tuple[str, int, int, int], int] = defaultdict(int)
    never_started: dict[int, int] = defaultdict(int)
    by_group: dict[tuple[int, str, bool], list[_Entry]] = defaultdict(list)
    for entry in entries:
        by_group[(dumps[entry.file].rank, entry.group, entry.p2p)].append(entry)
    sides: dict[tuple[str, int, int], dict[int, tuple[list[_PairOp], bool]]] = defaultdict(dict)
    for (rank, name, p2p), group_entries in by_group.items():
        group = members[name]
        if p2p:
            pairs, complete = _p2p_ops(rank, group_entries, dumps, never_started)
            for peer, pair_ops in pairs.items():
                sides[(name, min(rank, peer), max(rank, peer))][rank] = (pair_ops, complete)
            continue
        for op in _collective_ops(group_entries, never_started):
            key = (name, len(group), group.index(rank), rank)
            timelines[key].append(op)
            stops[key] = max(stops[key], _written(group_entries, dumps))
    for (name, low, high), by_rank in sides.items():
        comm = f"{name}:p2p:{low}-{high}"
        for rank, seqs in _pair_seqs(low, high, by_rank, len(members[name]) == 2).items():
            key = (comm, 2, 0 if rank == low else 1, rank)
            timelines[key].extend(seqs)
            stops[key] = max(
                [stops[key]] + [d.written_ns for d in dumps if d.rank == rank and _holds(d, name)]
            )
    _trim_to_common_history(timelines)
    for file, count in sorted(never_started.items()):
        result.skipped.append(
            f"{dumps[file].source}: {count} operations scheduled but never started:"
            " reported as not entered"
        )
    for (comm, size, comm_rank, rank), ops in timelines.items():
        try:
            result.messages.extend(
                _interval_messages(
                    job,
                    comm,
                    size,
                    comm_rank,
                    rank,
                    stops[(comm, size, comm_rank, rank)],
                    ops,
                    (places or {}).get(rank),
                    interval_ns,
                )
            )
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            result.skipped.append(
                f"rank {rank} process group {_short_repr(comm)}: not converted"
                f" ({where}: {first['msg']})"
            )
    result.messages.sort(key=lambda message: message.ts_ns)
    return result


def _trim_to_common_history(timelines: dict[tuple[str, int, int, int], list[_Op]]) -> None:
    """Drop what only some members still hold: operations older than the oldest one every
    member's ring buffer kept. Each member went on to later ones, so these had finished
    everywhere; reported by some members only, they would look like a member that never
    entered them."""
    floors: dict[str, int] = defaultdict(int)
    for (comm, *_), ops in timelines.items():
        if ops:
            floors[comm] = max(floors[comm], min(op.seq for op in ops))
    for (comm, *_), ops in timelines.items():
        ops[:] = [op for op in ops if op.seq >= floors[comm]]


def _holds(rank_dump: RankDump, name: str) -> bool:
    return any(
        isinstance(entry, Mapping)
        and isinstance(entry.get("process_group"), list | tuple)
        and entry["process_group"]
        and str(entry["process_group"][0]) == name
        for entry in rank_dump.dump["entries"]
    )


def _written(entries: list[_Entry], dumps: list[RankDump]) -> int:
    return max(dumps[entry.file].written_ns for entry in entries)


def _tracks_starts(dump: Mapping[str, Any]) -> bool:
    """Whether the recorder saw operations start (NCCL with TORCH_NCCL_ENABLE_TIMING=1)."""
    return any(
        isinstance(entry, Mapping)
        and (entry.get("state") == "started" or entry.get("time_discovered_started_ns"))
        for entry in dump["entries"]
    )


def _trusts_retired(dump: Mapping[str, Any], backend: str) -> bool:
    """Whether ``retired`` means the operation completed.

    Native gloo retires an entry when its work finishes; NCCL records completion states and
    times. c10d's FlightRecorderHook (every backend that does not record itself: nccl2, mpi,
    ucc, plug-ins) retires an entry as soon as the call returns, before an isend or a
    blocking send completes, and records no state: there ``retired`` says nothing.
    """
    if backend == "gloo":
        return True
    return any(
        isinstance(entry, Mapping)
        and (
            entry.get("state") in ("started", "completed")
            or isinstance(entry.get("time_discovered_completed_ns"), int)
        )
        for entry in dump["entries"]
    )


def _entries(
    file: int, rank_dump: RankDump, members: Mapping[str, tuple[int, ...]], skipped: list[str]
) -> list[_Entry]:
    """The usable entries of one dump; a line in ``skipped`` for each other one."""
    me = rank_dump.rank
    status = rank_dump.dump.get("pg_status")
    starts = _tracks_starts(rank_dump.dump)
    trusted: dict[str, bool] = {}
    result: list[_Entry] = []
    for index, entry in enumerate(rank_dump.dump["entries"]):
        where = f"{rank_dump.source} entry {index}"
        try:
            name = str(entry["process_group"][0])
            profiling = str(entry["profiling_name"])
            op, rest = op_name(profiling)
            enter = int(entry["time_created_ns"])
            seq = int(entry.get("collective_seq_id") or 0)
            p2p_seq = int(entry.get("p2p_seq_id") or 0)
            op_id = int(entry.get("op_id") or 0)
            order = int(entry.get("record_id", index))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as error:
            skipped.append(f"{where}: malformed ({type(error).__name__}: {_short(error)})")
            continue
        if not all(0 <= value <= MAX_INT64 for value in (enter, seq, p2p_seq, op_id, order)):
            skipped.append(f"{where}: time_created_ns or a sequence id out of range")
            continue
        if not name or len(name) > MAX_ID_CHARS - 48:
            skipped.append(f"{where}: process group name {_short_repr(name)} empty or too long")
            continue
        backend, _, title = profiling.rpartition(":")
        word = title.strip().partition(" ")[0].lower()
        marker = word == "coalesced" or word.endswith("_coalesced")
        if op is None and word != "coalesced":
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
        p2p = op in ("send", "recv") or (op is None and entry.get("is_p2p") is True)
        peer: int | None = None
        if op in ("send", "recv"):
            peer = _peer(str(op), rest, group, me)
            if peer is None:
                skipped.append(f"{where}: point-to-point peer unknown ({_short_repr(rest)})")
                continue
        end = _end_ns(entry, enter, status)
        nbytes = _numel_bytes(entry.get("input_sizes"), entry.get("input_dtypes"))
        if op == "recv" and nbytes == 0:
            nbytes = _numel_bytes(entry.get("output_sizes"), entry.get("output_dtypes"))
        if (end is not None and end > MAX_INT64) or nbytes > MAX_INT64:
            skipped.append(f"{where}: completion time or size out of range")
            continue
        if backend not in trusted:
            trusted[backend] = _trusts_retired(rank_dump.dump, backend)
        retired = entry.get("retired") is True
        if end is None and retired and trusted[backend]:
            end = enter  # finished; the dump does not say when
        result.append(
            _Entry(
                file=file,
                order=order,
                thread=str(entry.get("thread_id", "")),
                group=name,
                op=op,
                marker=marker,
                p2p=p2p,
                peer=peer,
                seq=seq,
                p2p_seq=p2p_seq,
                op_id=op_id,
                nbytes=nbytes,
                enter_ns=enter,
                end_ns=end,
                returned=retired and end is None,
                never_started=(
                    starts and end is None and not retired and entry.get("state") == "scheduled"
                ),
            )
        )
    return result


def _infer_returned(entries: list[_Entry], dumps: list[RankDump]) -> None:
    """A call that returned (hook-recorded) and was followed by another call of the same
    thread of the same rank (in any of its dumps) had finished: calls of a thread are made
    one after the other, and a blocking one returns when done. The last one may be waiting.
    """
    by_thread: dict[tuple[int, str], list[_Entry]] = defaultdict(list)
    for entry in entries:
        by_thread[(dumps[entry.file].rank, entry.thread)].append(entry)
    for thread_entries in by_thread.values():
        thread_entries.sort(key=lambda e: (e.enter_ns, e.file, e.order))
        for entry in thread_entries[:-1]:
            if entry.returned:
                entry.end_ns = entry.enter_ns


def _coalesced(entries: list[_Entry]) -> None:
    """The entries of one coalesced group take the state of its closing entry.

    NCCL records each operation of a group (same sequence id) without events of its own,
    then a closing entry (``nccl:coalesced``, ``nccl:allreduce_coalesced``...) whose state
    and times are the group's.
    """
    closing = [entry for entry in entries if entry.marker]
    if len(entries) < 2 or not closing:
        return
    last = max(closing, key=lambda entry: entry.order)
    for entry in entries:
        entry.end_ns = max(last.end_ns, entry.enter_ns) if last.end_ns is not None else None
        entry.never_started = last.never_started


def _collective_ops(entries: list[_Entry], never_started: dict[int, int]) -> list[_Op]:
    """One operation per ``collective_seq_id`` (a coalesced group is one operation)."""
    by_seq: dict[int, list[_Entry]] = defaultdict(list)
    for entry in entries:
        by_seq[entry.seq].append(entry)
    ops: list[_Op] = []
    for seq, group in sorted(by_seq.items()):
        _coalesced(group)
        named = [entry.op for entry in group if entry.op is not None]
        if not named:
            continue  # a closing entry whose operations the ring buffer dropped
        if all(entry.never_started for entry in group):
            never_started[group[0].file] += 1
            continue
        parts = [entry for entry in group if not entry.marker] or group
        ends = [entry.end_ns for entry in group]
        ops.append(
            _Op(
                seq,
                named[0],
                sum(entry.nbytes for entry in parts),
                min(entry.enter_ns for entry in group),
                None if any(end is None for end in ends) else max(e for e in ends if e is not None),
            )
        )
    return ops


def _p2p_ops(
    rank: int, entries: list[_Entry], dumps: list[RankDump], never_started: dict[int, int]
) -> tuple[dict[int, list[_PairOp]], bool]:
    """One rank's point-to-point operations of one process group, per peer, in order; and
    whether the group's history is whole (nothing dropped by the ring buffer before it)."""
    by_step: dict[int, list[_Entry]] = defaultdict(list)
    for entry in entries:
        by_step[entry.p2p_seq].append(entry)
    pairs: dict[int, list[_PairOp]] = defaultdict(list)
    for step, group in sorted(by_step.items()):
        _coalesced(group)
        counts: dict[tuple[int, int], int] = defaultdict(int)
        # Inside a batch the order of the calls may differ between the two sides: the
        # lower rank's sends first, then the higher rank's, each in call order.
        group.sort(key=lambda e: (e.peer is None, not _low_sends(rank, e), e.op_id, e.order))
        for entry in group:
            if entry.peer is None or entry.op is None:
                continue
            if entry.never_started:
                never_started[entry.file] += 1
                continue
            direction = 0 if _low_sends(rank, entry) else 1
            counts[(entry.peer, direction)] += 1
            pairs[entry.peer].append(
                _PairOp(
                    low_to_high=direction == 0,
                    op=_Op(0, entry.op, entry.nbytes, entry.enter_ns, entry.end_ns),
                    key=(step, direction, counts[(entry.peer, direction)]),
                )
            )
    first = min(entries, key=lambda e: (e.p2p_seq, e.order))
    oldest = min(
        (
            int(e.get("record_id", 0))
            if isinstance(e, Mapping) and isinstance(e.get("record_id"), int)
            else 0
        )
        for e in dumps[first.file].dump["entries"]
    )
    complete = oldest == 0 or (first.p2p_seq == 1 and first.order > oldest)
    return pairs, complete


def _low_sends(rank: int, entry: _Entry) -> bool:
    """Whether the operation carries data from the pair's lower rank to its higher one."""
    if entry.peer is None:
        return False
    sender = rank if entry.op == "send" else entry.peer
    return sender == min(rank, entry.peer)


def _pair_seqs(
    low: int, high: int, sides: Mapping[int, tuple[list[_PairOp], bool]], whole_group: bool
) -> dict[int, list[_Op]]:
    """Each side's operations of one pair with the pair's own ``seq``, the same for the same
    operation on both sides.

    A pair that is its whole process group: Flight Recorder's ``p2p_seq_id`` counts the
    group's operations on both sides alike, so (p2p_seq_id, direction, index) names the same
    operation on both. Otherwise the group's counter also counts each side's operations with
    other peers: the k-th operation of the pair on one side is the k-th on the other, the
    offset between the two lists being 0 when neither lost entries, else the one under which
    directions and sizes agree and matched operations were called closest in time.
    """
    result: dict[int, list[_Op]] = {}
    if whole_group:
        keys = sorted({op.key for ops, _ in sides.values() for op in ops})
        number = {key: index + 1 for index, key in enumerate(keys)}
        for rank, (ops, _) in sides.items():
            result[rank] = [_with_seq(op.op, number[op.key]) for op in ops]
        return result
    a, a_whole = sides.get(low, ([], True))
    b, b_whole = sides.get(high, ([], True))
    offset = _offset(a, b, a_whole, b_whole)
    shift = max(0, -offset)
    if low in sides:
        result[low] = [_with_seq(op.op, i + 1 + shift) for i, op in enumerate(a)]
    if high in sides:
        result[high] = [_with_seq(op.op, j + offset + 1 + shift) for j, op in enumerate(b)]
    return result


def _with_seq(op: _Op, seq: int) -> _Op:
    return _Op(seq, op.op, op.nbytes, op.enter_ns, op.end_ns)


def _offset(a: list[_PairOp], b: list[_PairOp], a_whole: bool, b_whole: bool) -> int:
    """``o`` such that ``b[j]`` is the same operation as ``a[j + o]``."""
    if not a or not b or (a_whole and b_whole):
        return 0
    times = [op.op.enter_ns for op in a]
    candidates = {0}
    for j in {0, len(b) // 2, len(b) - 1}:
        near = bisect.bisect_left(times, b[j].op.enter_ns)
        candidates.update(i - j for i in range(near - 2, near + 2) if 0 <= i < len(a))
    if a_whole:  # only b lost its oldest entries: b starts at or after a's start
        candidates = {o for o in candidates if o >= 0} or {0}
    if b_whole:
        candidates = {o for o in candidates if o <= 0} or {0}

    def cost(offset: int) -> tuple[int, int, float, int]:
        matched = [
            (a[j + offset], b[j]) for j in range(max(0, -offset), min(len(b), len(a) - offset))
        ]
        wrong = sum(
            x.low_to_high != y.low_to_high
            or (x.op.nbytes and y.op.nbytes and x.op.nbytes != y.op.nbytes)
            for x, y in matched
        )
        skew = sum(abs(x.op.enter_ns - y.op.enter_ns) for x, y in matched) / max(len(matched), 1)
        return (wrong, not matched, skew, abs(offset))

    return min(sorted(candidates), key=cost)


def _end_ns(entry: Mapping[str, Any], enter: int, status: Any) -> int | None:
    completed = entry.get("time_discovered_completed_ns")
    if isinstance(completed, int):
        return max(completed, enter)
    if entry.get("state") == "completed":
        return enter  # finished; the dump does not say when
    pg_status = status.get(str(entry.get("pg_id"))) if isinstance(status, Mapping) else None
    if isinstance(pg_status, Mapping) and not entry.get("is_p2p"):
        last = pg_status.get("last_completed_collective")
        seq = entry.get("collective_seq_id", 0)
        if isinstance(last, int) and isinstance(seq, int) and 0 < seq <= last:
            return enter
    return None


def _short(error: Exception, limit: int = 120) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _peer(op: str, rest: str, group: tuple[int, ...], me: int) -> int | None:
    """The peer's global rank. ``send a->b`` and ``recv a<-b`` name this rank (a) and the
    peer (b) by their ranks in the group; the group's ranks map them to global ranks."""
    match = _P2P.match(f"{op} {rest}")
    if match is None or match.group(4) == "?":
        return None
    own, local = int(match.group(2)), int(match.group(4))
    if own >= len(group) or group[own] != me or local >= len(group) or local == own:
        return None
    return group[local]


def _interval_messages(
    job: str,
    comm: str,
    size: int,
    comm_rank: int,
    global_rank: int,
    written_ns: int,
    ops: list[_Op],
    place: RankPlace | None,
    interval_ns: int,
) -> list[Collective]:
    """The messages a live agent would have sent for one rank and communicator."""
    if not ops:
        return []
    ops = sorted(ops, key=lambda op: op.enter_ns)
    stop = max(written_ns, max(op.end_ns or op.enter_ns for op in ops))
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
            messages.append(_message(job, comm, size, comm_rank, global_rank, ts, part, place))
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
    """Watches a dump folder; each new or rewritten dump becomes that rank's messages.

    The folder's other dumps are read again with it: a pair's point-to-point ``seq`` is
    aligned across its two sides.
    """

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
        dumps: list[RankDump] = []
        changed: set[int] = set()
        for path in paths:
            if not path.is_file() or not _RANK_SUFFIX.search(path.name):
                continue
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                continue
            new = self._seen.get(path) != mtime
            self._seen[path] = mtime
            try:
                dump = read_dump_file(path)
            except FlightRecorderError as error:
                if new:
                    reading.problems.append(str(error))
                continue
            dumps.append(dump)
            if new:
                changed.add(dump.rank)
        if not changed:
            return reading
        conversion = convert(dumps, self.job)
        reading.messages.extend(m for m in conversion.messages if m.global_rank in changed)
        reading.problems.extend(conversion.skipped)
        return reading

    def close(self) -> None:
        """Nothing is held open between rounds."""

"""A Flight Recorder dump's entries as records: op, group, peer, bytes, enter and end.

Each entry is checked on its own (a malformed one is skipped, with one line saying why):
its profiling name maps to the contract's op, a point-to-point peer is named by group rank
and mapped to its global rank, sizes come from shapes and dtypes, and its end from
``time_discovered_completed_ns``, its ``state``, the group's ``pg_status`` or ``retired``
where the backend makes that mean completed (`_records_completion`). Process-group members
come from ``pg_config``, else from the dumps that hold the group. Names are taken from
scalars only and sizes are multiplied in bounds (`numel_bytes`): a dump may be hostile.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import Any

from producers.fr_dump import RankDump, short_text
from schemas.base import MAX_ID_CHARS
from schemas.messages import OpName

MAX_INT64 = 2**63 - 1
# Real tensors have a handful of dimensions; a shape of more than 64 is taken for a forged one.
MAX_TENSOR_DIMS = 64
# Profiling names are short ("nccl:all_reduce", "nccl:send 0->1"); a long one is not one.
MAX_PROFILING_CHARS = 256
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
# Backends that record themselves and retire an entry when its work completed (gloo when
# the work finishes, ProcessGroupNCCL when its watchdog sees the end event: with timing off
# that is the only sign of completion, states stay "scheduled").
NATIVE_RECORDERS = ("gloo", "nccl")
_P2P = re.compile(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+|\?)$")
# pg_config's ranks as torch writes them, "[0, 1, 2]" (or a tuple's "(0, 1)").
_RANK_LIST = re.compile(r"\s*[\[(]\s*(?:\d{1,19}\s*(?:,\s*\d{1,19}\s*)*,?\s*)?[\])]\s*")
_RANK = re.compile(r"\d+")


def scalar_text(value: Any) -> str:
    """A name or id given as a scalar, as text; TypeError for anything else (the text of a
    list or dict could be huge, and nested ones recurse)."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool | float):
        return str(value)
    if isinstance(value, int) and abs(value) <= MAX_INT64:
        return str(value)
    message = f"{type(value).__name__} where a name was expected"
    raise TypeError(message)


def parse_ranks(ranks: Any) -> tuple[int, ...]:
    """A group's member ranks from pg_config ("[0, 1, 2]" or a list); ValueError otherwise.

    Read with a regular expression, not ast.literal_eval: a long string would build a
    syntax tree first, a nested one recurse.
    """
    if isinstance(ranks, str):
        if _RANK_LIST.fullmatch(ranks) is None:
            message = "ranks are not a list of numbers"
            raise ValueError(message)
        return tuple(int(rank) for rank in _RANK.findall(ranks))
    if not isinstance(ranks, list | tuple):
        message = "ranks are not a list"
        raise ValueError(message)
    if not all(isinstance(rank, int) and not isinstance(rank, bool) for rank in ranks):
        message = "ranks are not all integers"
        raise ValueError(message)
    return tuple(ranks)


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


@dataclass(slots=True)
class Entry:
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
    returned: bool  # retired, which here only says the call returned (see _records_completion)
    never_started: bool
    # Its call holds the calling thread until it returns (a CPU backend: gloo, or one the
    # hook records); ProcessGroupNCCL's returns once the work is enqueued on the GPU.
    holds_thread: bool = True


def _members_from_config(dump: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    members: dict[str, tuple[int, ...]] = {}
    config = dump.get("pg_config")
    if not isinstance(config, Mapping):
        return members
    for key, value in config.items():
        if not isinstance(value, Mapping):
            continue
        try:
            group = parse_ranks(value.get("ranks"))
            name = scalar_text(value.get("name") or key)
        except (ValueError, TypeError):
            continue
        if any(not 0 <= rank <= MAX_INT64 for rank in group) or len(set(group)) != len(group):
            continue
        if group and name:
            members[name] = group
    return members


def members_of(dumps: list[RankDump]) -> dict[str, tuple[int, ...]]:
    """Global group name -> member global ranks, in group-rank order."""
    members: dict[str, tuple[int, ...]] = {}
    for rank_dump in dumps:
        members.update(_members_from_config(rank_dump.dump))
    # Groups the config does not describe: members are the ranks whose dumps hold them.
    seen_in: dict[str, set[int]] = defaultdict(set)
    for rank_dump in dumps:
        for name in groups_held(rank_dump):
            seen_in[name].add(rank_dump.rank)
    for name, ranks in seen_in.items():
        if name not in members or not set(ranks) <= set(members[name]):
            members[name] = tuple(sorted(ranks | set(members.get(name, ()))))
    return members


def groups_held(rank_dump: RankDump) -> set[str]:
    """The names of the process groups a dump has entries of."""
    names: set[str] = set()
    for entry in rank_dump.dump["entries"]:
        group = entry.get("process_group") if isinstance(entry, Mapping) else None
        if isinstance(group, list | tuple) and group:
            try:
                names.add(scalar_text(group[0]))
            except TypeError:
                continue
    return names


def numel_bytes(sizes: Any, dtypes: Any) -> int:
    """The bytes of an entry's tensors, from their shapes and dtypes; ValueError when a
    shape has too many dimensions or the size passes 64 bits.

    The product stops as soon as it passes 64 bits, so the cost is the number of dimensions
    (multiplying first cost minutes for shapes of thousands of dimensions of 2**62).
    Dimensions that are not counts (negative, not integers) count as empty, as before.
    """
    if not isinstance(sizes, list | tuple):
        return 0
    dtype_list = dtypes if isinstance(dtypes, list | tuple) else []
    total = 0
    for index, shape in enumerate(sizes):
        dims = shape if isinstance(shape, list | tuple) else []
        if len(dims) > MAX_TENSOR_DIMS:
            message = f"a tensor shape of {len(dims)} dimensions (at most {MAX_TENSOR_DIMS})"
            raise ValueError(message)
        count = 1
        for dim in dims:
            if not isinstance(dim, int) or dim < 0:
                count = 0
            elif dim > MAX_INT64:
                message = "a tensor dimension beyond 64 bits"
                raise ValueError(message)
            else:
                count *= dim
            if count > MAX_INT64:
                message = "a tensor size beyond 64 bits"
                raise ValueError(message)
        dtype = dtype_list[index] if index < len(dtype_list) else "float"
        width = DTYPE_BYTES.get(dtype.lower(), 4) if isinstance(dtype, str) else 4
        total += count * width
        if total > MAX_INT64:
            message = "a size beyond 64 bits"
            raise ValueError(message)
    return total


def _tracks_starts(dump: Mapping[str, Any]) -> bool:
    """Whether the recorder saw operations start (NCCL with TORCH_NCCL_ENABLE_TIMING=1)."""
    return any(
        isinstance(entry, Mapping)
        and (entry.get("state") == "started" or entry.get("time_discovered_started_ns"))
        for entry in dump["entries"]
    )


def _records_completion(dump: Mapping[str, Any]) -> bool:
    """Whether the recorder recorded completions (states or completion times).

    Where it did, ``retired`` means the operation completed; so it does with the backends
    that record natively (`NATIVE_RECORDERS`). c10d's FlightRecorderHook (every backend
    that does not record itself: nccl2, mpi, ucc, plug-ins) retires an entry as soon as the
    call returns, before an isend or a blocking send completes, and records no state: there
    ``retired`` says nothing.
    """
    return any(
        isinstance(entry, Mapping)
        and (
            entry.get("state") in ("started", "completed")
            or isinstance(entry.get("time_discovered_completed_ns"), int)
        )
        for entry in dump["entries"]
    )


def entries_of(
    file: int, rank_dump: RankDump, members: Mapping[str, tuple[int, ...]], skipped: list[str]
) -> list[Entry]:
    """The usable entries of one dump; a line in ``skipped`` for each other one."""
    me = rank_dump.rank
    status = rank_dump.dump.get("pg_status")
    starts = _tracks_starts(rank_dump.dump)
    records_completion = _records_completion(rank_dump.dump)  # once: the scan is the dump's
    member_of: dict[str, bool] = {}
    result: list[Entry] = []
    for index, entry in enumerate(rank_dump.dump["entries"]):
        where = f"{rank_dump.source} entry {index}"
        try:
            name = scalar_text(entry["process_group"][0])
            profiling = scalar_text(entry["profiling_name"])
            if len(profiling) > MAX_PROFILING_CHARS:
                message = f"a profiling name of {len(profiling)} characters"
                raise ValueError(message)
            op, rest = op_name(profiling)
            created = entry["time_created_ns"]
            if isinstance(created, bool):  # int() takes it, and it is no time
                raise TypeError("time_created_ns is a boolean")  # noqa: EM101, TRY301
            enter = int(created)
            seq = int(entry.get("collective_seq_id") or 0)
            p2p_seq = int(entry.get("p2p_seq_id") or 0)
            op_id = int(entry.get("op_id") or 0)
            order = int(entry.get("record_id", index))
            thread = scalar_text(entry.get("thread_id", ""))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as error:
            skipped.append(f"{where}: malformed ({type(error).__name__}: {short_text(error)})")
            continue
        if not all(0 <= value <= MAX_INT64 for value in (enter, seq, p2p_seq, op_id, order)):
            skipped.append(f"{where}: time_created_ns or a sequence id out of range")
            continue
        if not name or len(name) > MAX_ID_CHARS - 48:
            skipped.append(f"{where}: process group name {short_repr(name)} empty or too long")
            continue
        backend, _, title = profiling.rpartition(":")
        word = title.strip().partition(" ")[0].lower()
        marker = word == "coalesced" or word.endswith("_coalesced")
        if op is None and word != "coalesced":
            skipped.append(
                f"{where}: {short_repr(entry.get('profiling_name'))} is not a v1 operation"
            )
            continue
        group = members.get(name, ())
        if name not in member_of:  # once per group: a scan per entry was quadratic
            member_of[name] = me in group
        if not member_of[name]:
            skipped.append(
                f"{where}: rank {me} is not a member of process group {short_repr(name)}"
            )
            continue
        p2p = op in ("send", "recv") or (op is None and entry.get("is_p2p") is True)
        peer: int | None = None
        if op in ("send", "recv"):
            peer = _peer(str(op), rest, group, me)
            if peer is None:
                skipped.append(f"{where}: point-to-point peer unknown ({short_repr(rest)})")
                continue
        end = _end_ns(entry, enter, status)
        try:
            nbytes = numel_bytes(entry.get("input_sizes"), entry.get("input_dtypes"))
            if op == "recv" and nbytes == 0:
                nbytes = numel_bytes(entry.get("output_sizes"), entry.get("output_dtypes"))
        except ValueError as error:
            skipped.append(f"{where}: {error}")
            continue
        if end is not None and end > MAX_INT64:
            skipped.append(f"{where}: completion time out of range")
            continue
        retired = entry.get("retired") is True
        if end is None and retired and (backend in NATIVE_RECORDERS or records_completion):
            end = enter  # finished; the dump does not say when
        result.append(
            Entry(
                file=file,
                order=order,
                thread=thread,
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
                holds_thread=backend != "nccl",
                never_started=(
                    starts and end is None and not retired and entry.get("state") == "scheduled"
                ),
            )
        )
    return result


def infer_returned(entries: list[Entry], dumps: list[RankDump]) -> None:
    """A call that returned (hook-recorded) and was followed by another call of the same
    thread of the same rank (in any of its dumps) had finished: calls of a thread are made
    one after the other, and a blocking one returns when done. The last one may be waiting.
    """
    by_thread: dict[tuple[int, str], list[Entry]] = defaultdict(list)
    for entry in entries:
        by_thread[(dumps[entry.file].rank, entry.thread)].append(entry)
    for thread_entries in by_thread.values():
        thread_entries.sort(key=lambda e: (e.enter_ns, e.file, e.order))
        for entry in thread_entries[:-1]:
            if entry.returned:
                entry.end_ns = entry.enter_ns


def _end_ns(entry: Mapping[str, Any], enter: int, status: Any) -> int | None:
    completed = entry.get("time_discovered_completed_ns")
    if isinstance(completed, int) and not isinstance(completed, bool):
        return max(completed, enter)
    if entry.get("state") == "completed":
        return enter  # finished; the dump does not say when
    try:
        pg_id = scalar_text(entry.get("pg_id"))
    except TypeError:
        return None
    pg_status = status.get(pg_id) if isinstance(status, Mapping) else None
    if isinstance(pg_status, Mapping) and not entry.get("is_p2p"):
        last = pg_status.get("last_completed_collective")
        seq = entry.get("collective_seq_id", 0)
        if isinstance(last, int) and isinstance(seq, int) and 0 < seq <= last:
            return enter
    return None


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


def short_repr(value: Any, limit: int = 60) -> str:
    """A value as Python writes it, cut to ``limit`` characters; a container only by its type
    and length (writing one out could be huge, or recurse)."""
    if isinstance(value, str):
        text = repr(value[:limit])
    elif value is None or isinstance(value, bool | int | float):
        text = (
            repr(value) if not isinstance(value, int) or abs(value) <= MAX_INT64 else "a huge int"
        )
    elif isinstance(value, Sized):
        text = f"<{type(value).__name__} of {len(value)}>"
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""Flight Recorder dumps as the v1 collective messages a live agent would have sent.

The messages rebuild what a live agent would have sent from each rank: one message per
communicator per interval from the rank's first recorded operation up to the moment it
wrote the dump (the file's modification time), each operation reported when it was entered
(``end_ns`` null while in flight) and again when it completed. Point-to-point operations go
to the pair's own communicator (``<name>:p2p:<lo>-<hi>``) with a per-pair ``seq``
(`producers.fr_align.pair_seqs`; Flight Recorder's ``p2p_seq_id`` counts a rank's operations
of the whole group). Completed operations without a completion time (gloo records none) get
``end_ns`` = ``enter_ns``: they finished, when is unknown. A rank may have several dumps
(one per backend: torch keeps one recorder per backend name).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from producers.fr_align import (
    Op,
    PairOp,
    collective_ops,
    oldest_record_id,
    p2p_ops,
    pair_seqs,
    trim_to_common_history,
)
from producers.fr_dump import RankDump
from producers.fr_entries import (
    Entry,
    entries_of,
    groups_held,
    infer_returned,
    members_of,
    short_repr,
)
from producers.fr_stall import stopped_ranks
from schemas.base import MAX_ITEMS
from schemas.messages import Collective, Ops, RankPlace

NS_PER_S = 1_000_000_000
# Heartbeats go back at most this many intervals before a timeline's end (an hour at 1 s):
# older operations are reported in its first message. Bounds the output of a dump whose
# entries span days (or claim a creation time of 0).
MAX_INTERVALS = 3_600
# And a rank's heartbeats in all: beyond this many communicators (a job has a handful; a
# forged dump can name a new peer in each entry, 7 KB gave 356,000 messages) each one's
# go back a share of this many times MAX_INTERVALS, at least one interval.
FULL_TIMELINES_PER_RANK = 64


@dataclass(slots=True)
class Conversion:
    """The messages of a conversion and what was skipped (one line each)."""

    messages: list[Collective] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def convert(
    dumps: Iterable[RankDump],
    job: str,
    places: Mapping[int, RankPlace] | None = None,
    interval_ns: int = NS_PER_S,
) -> Conversion:
    """v1 collective messages of every rank's dump (a rank may have several: one per backend).

    Collectives are aligned across ranks by ``collective_seq_id``; point-to-point operations
    by each pair's own order (``pair_seqs``), never by position in a dump, whose ring
    buffer may have dropped its oldest entries.
    """
    dumps = list(dumps)
    members = members_of(dumps)
    result = Conversion()
    entries: list[Entry] = []
    for file, rank_dump in enumerate(dumps):
        entries.extend(entries_of(file, rank_dump, members, result.skipped))
    infer_returned(entries, dumps)
    _not_entered_by_stopped(dumps, entries, members, result.skipped)
    # Found once each: per group or per operation, they made a dump of many quadratic.
    oldest_records = [oldest_record_id(rank_dump) for rank_dump in dumps]
    held = [groups_held(rank_dump) for rank_dump in dumps]
    timelines: dict[tuple[str, int, int, int], list[Op]] = defaultdict(list)
    stops: dict[tuple[str, int, int, int], int] = defaultdict(int)
    never_started: dict[int, int] = defaultdict(int)
    by_group: dict[tuple[int, str, bool], list[Entry]] = defaultdict(list)
    for entry in entries:
        by_group[(dumps[entry.file].rank, entry.group, entry.p2p)].append(entry)
    sides: dict[tuple[str, int, int], dict[int, tuple[list[PairOp], bool]]] = defaultdict(dict)
    for (rank, name, p2p), group_entries in by_group.items():
        group = members[name]
        if p2p:
            pairs, complete = p2p_ops(rank, group_entries, oldest_records, never_started)
            for peer, pair_ops in pairs.items():
                sides[(name, min(rank, peer), max(rank, peer))][rank] = (pair_ops, complete)
            continue
        ops = collective_ops(group_entries, never_started)
        if not ops:
            continue
        key = (name, len(group), group.index(rank), rank)
        timelines[key].extend(ops)
        stops[key] = max(stops[key], _written(group_entries, dumps))
    for (name, low, high), by_rank in sides.items():
        comm = f"{name}:p2p:{low}-{high}"
        for rank, seqs in pair_seqs(low, high, by_rank, len(members[name]) == 2).items():
            key = (comm, 2, 0 if rank == low else 1, rank)
            timelines[key].extend(seqs)
            stops[key] = max(
                [stops[key]]
                + [d.written_ns for f, d in enumerate(dumps) if d.rank == rank and name in held[f]]
            )
    trim_to_common_history(timelines)
    _membership_timelines(dumps, members, timelines, stops)
    for file, count in sorted(never_started.items()):
        result.skipped.append(
            f"{dumps[file].source}: {count} operations scheduled but never started:"
            " reported as not entered"
        )
    first_of: dict[int, int] = {}
    for (*_, rank), ops in timelines.items():
        for op in ops:
            first_of[rank] = min(first_of.get(rank, op.enter_ns), op.enter_ns)
    span = _heartbeat_spans(timelines, first_of, result.skipped)
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
                    span.get(rank, MAX_INTERVALS),
                    first_of.get(rank),
                )
            )
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            result.skipped.append(
                f"rank {rank} process group {short_repr(comm)}: not converted"
                f" ({where}: {first['msg']})"
            )
    result.messages.sort(key=lambda message: message.ts_ns)
    return result


def _not_entered_by_stopped(
    dumps: list[RankDump],
    entries: list[Entry],
    members: Mapping[str, tuple[int, ...]],
    skipped: list[str],
) -> None:
    """The unfinished calls of a rank that stopped issuing (`producers.fr_stall`) are not
    reported entered: it is not waiting in them (its GPU stopped, or they wait for peers that
    wait for it), and reported as waiting it would pass for a waiter, not the rank that stopped.
    Only where the dumps do not say what started (timing off): else they say it."""
    tracked = {
        dumps[entry.file].rank
        for entry in entries
        if entry.end_ns is None and not entry.never_started and entry.op is not None
    }
    stopped = stopped_ranks(dumps, entries, members)
    for rank, why in sorted(stopped.items()):
        unfinished = [
            entry
            for entry in entries
            if dumps[entry.file].rank == rank and entry.end_ns is None and not entry.never_started
        ]
        if not unfinished or rank not in tracked:
            continue  # nothing reported differently
        if any(_timed(dumps[entry.file]) for entry in unfinished):
            continue
        for entry in unfinished:
            entry.never_started = True
        skipped.append(
            f"rank {rank}: stopped issuing ({why}): its {len(unfinished)} unfinished"
            " operations reported as not entered"
        )


def _timed(rank_dump: RankDump) -> bool:
    """Whether a dump says which operations started (TORCH_NCCL_ENABLE_TIMING=1)."""
    return any(
        isinstance(entry, Mapping) and isinstance(entry.get("time_discovered_started_ns"), int)
        for entry in rank_dump.dump["entries"]
    )


def _membership_timelines(
    dumps: list[RankDump],
    members: Mapping[str, tuple[int, ...]],
    timelines: dict[tuple[str, int, int, int], list[Op]],
    stops: dict[tuple[str, int, int, int], int],
) -> None:
    """A timeline, empty where none is, for every group each rank with a dump is a member of:
    its heartbeats name it as that member (by global rank) although its ring buffer kept none
    of the group's operations."""
    has = {(comm, rank) for (comm, _, _, rank) in timelines}
    # Only communicators that other ranks report in: a member unheard of there is the one
    # named by its index. Each rank heartbeats within its share (`_heartbeat_spans`).
    reported = {comm for (comm, _, _, _), ops in timelines.items() if ops}
    written: dict[int, int] = defaultdict(int)
    for rank_dump in dumps:
        written[rank_dump.rank] = max(written[rank_dump.rank], rank_dump.written_ns)
    for name, group in members.items():
        if name not in reported:
            continue
        for index, rank in enumerate(group):
            if rank in written and (name, rank) not in has:
                key = (name, len(group), index, rank)
                timelines[key] = []
                stops[key] = written[rank]


def _heartbeat_spans(
    timelines: Mapping[tuple[str, int, int, int], list[Op]],
    first_of: Mapping[int, int],
    skipped: list[str],
) -> dict[int, int]:
    """Global rank -> how many intervals back each of its timelines reports (those without
    operations count too: they heartbeat from the rank's first operation)."""
    count: dict[int, int] = defaultdict(int)
    for (*_, rank), ops in timelines.items():
        count[rank] += bool(ops) or rank in first_of
    span: dict[int, int] = {}
    for rank, timelines_of_rank in count.items():
        share = MAX_INTERVALS * FULL_TIMELINES_PER_RANK // max(timelines_of_rank, 1)
        span[rank] = max(1, min(MAX_INTERVALS, share))  # an hour at most, as the docstring
        if span[rank] < MAX_INTERVALS:
            skipped.append(
                f"rank {rank}: {timelines_of_rank} communicators: heartbeats for the last"
                f" {span[rank]} intervals only (older operations in their first message)"
            )
    return span


def _written(entries: list[Entry], dumps: list[RankDump]) -> int:
    return max(dumps[entry.file].written_ns for entry in entries)


def _interval_messages(
    job: str,
    comm: str,
    size: int,
    comm_rank: int,
    global_rank: int,
    written_ns: int,
    ops: list[Op],
    place: RankPlace | None,
    interval_ns: int,
    intervals: int = MAX_INTERVALS,
    first_ns: int | None = None,
) -> list[Collective]:
    """The messages a live agent would have sent for one rank and communicator, going back
    at most ``intervals`` intervals before its end; without operations, heartbeats from
    ``first_ns`` (none when it is None)."""
    if not ops and first_ns is None:
        return []
    ops = sorted(ops, key=lambda op: op.enter_ns)
    stop = max([written_ns] + [op.end_ns or op.enter_ns for op in ops])
    messages: list[Collective] = []
    first = ops[0].enter_ns if ops or first_ns is None else first_ns
    start = max(first, stop - intervals * interval_ns)
    ts = start - start % interval_ns + interval_ns
    next_index = 0
    # Operations reported entered and not yet completed, by completion time (a heap: one
    # scan of them all per interval made many in flight quadratic); those that never
    # complete are reported once, when entered.
    completing: list[tuple[int, int, Op]] = []
    while True:
        chosen: list[Op] = []
        while completing and completing[0][0] < ts:
            chosen.append(heapq.heappop(completing)[2])
        while next_index < len(ops) and ops[next_index].enter_ns < ts:
            op = ops[next_index]
            chosen.append(op)
            if op.end_ns is not None and op.end_ns >= ts:
                heapq.heappush(completing, (op.end_ns, next_index, op))
            next_index += 1
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
    ops: list[Op],
    place: RankPlace | None,
) -> Collective:
    return Collective.of(
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

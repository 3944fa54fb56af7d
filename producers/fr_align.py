"""Flight Recorder entries as each rank's operations per communicator, aligned across ranks.

Collectives are aligned by ``collective_seq_id`` (a coalesced group is one operation, with
its closing entry's state); point-to-point operations by each pair's own order
(`pair_seqs`), never by position in a dump, whose ring buffer may have dropped its oldest
entries. What only some members still hold is trimmed (`trim_to_common_history`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from producers.fr_dump import RankDump
from producers.fr_entries import Entry
from schemas.messages import OpName


@dataclass(slots=True)
class Op:
    seq: int
    op: OpName
    nbytes: int
    enter_ns: int
    end_ns: int | None


@dataclass(slots=True)
class PairOp:
    """A point-to-point operation of one side of a pair, in that side's order."""

    low_to_high: bool  # direction: the lower global rank sends
    op: Op
    key: tuple[int, int, int]  # (p2p_seq_id, direction, index): equal on both sides of a pair
    #                            that is its whole process group


def trim_to_common_history(timelines: dict[tuple[str, int, int, int], list[Op]]) -> None:
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


def _coalesced(entries: list[Entry]) -> None:
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


def collective_ops(entries: list[Entry], never_started: dict[int, int]) -> list[Op]:
    """One operation per ``collective_seq_id`` (a coalesced group is one operation)."""
    by_seq: dict[int, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_seq[entry.seq].append(entry)
    ops: list[Op] = []
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
            Op(
                seq,
                named[0],
                sum(entry.nbytes for entry in parts),
                min(entry.enter_ns for entry in group),
                None if any(end is None for end in ends) else max(e for e in ends if e is not None),
            )
        )
    return ops


def oldest_record_id(rank_dump: RankDump) -> int:
    """The smallest ``record_id`` a dump holds (0 when none says): 0 unless its ring buffer
    dropped entries."""
    return min(
        (
            entry["record_id"]
            if isinstance(entry, Mapping) and isinstance(entry.get("record_id"), int)
            else 0
            for entry in rank_dump.dump["entries"]
        ),
        default=0,
    )


def p2p_ops(
    rank: int, entries: list[Entry], oldest_records: Sequence[int], never_started: dict[int, int]
) -> tuple[dict[int, list[PairOp]], bool]:
    """One rank's point-to-point operations of one process group, per peer, in order; and
    whether the group's history is whole (nothing dropped by the ring buffer before it).

    ``oldest_records``: `oldest_record_id` of each dump, found once per dump rather than
    once per group (a dump of many groups made that quadratic)."""
    by_step: dict[int, list[Entry]] = defaultdict(list)
    for entry in entries:
        by_step[entry.p2p_seq].append(entry)
    pairs: dict[int, list[PairOp]] = defaultdict(list)
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
                PairOp(
                    low_to_high=direction == 0,
                    op=Op(0, entry.op, entry.nbytes, entry.enter_ns, entry.end_ns),
                    key=(step, direction, counts[(entry.peer, direction)]),
                )
            )
    first = min(entries, key=lambda e: (e.p2p_seq, e.order))
    oldest = oldest_records[first.file]
    complete = oldest == 0 or (first.p2p_seq == 1 and first.order > oldest)
    return pairs, complete


def _low_sends(rank: int, entry: Entry) -> bool:
    """Whether the operation carries data from the pair's lower rank to its higher one."""
    if entry.peer is None:
        return False
    sender = rank if entry.op == "send" else entry.peer
    return sender == min(rank, entry.peer)


def pair_seqs(
    low: int, high: int, sides: Mapping[int, tuple[list[PairOp], bool]], whole_group: bool
) -> dict[int, list[Op]]:
    """Each side's operations of one pair with the pair's own ``seq``, the same for the same
    operation on both sides.

    A pair that is its whole process group: Flight Recorder's ``p2p_seq_id`` counts the
    group's operations on both sides alike, so (p2p_seq_id, direction, index) names the same
    operation on both. Otherwise the group's counter also counts each side's operations with
    other peers: the k-th operation of the pair on one side is the k-th on the other, the
    offset between the two lists being 0 when neither lost entries, else the one under which
    directions and sizes agree and matched operations were called closest in time.
    """
    result: dict[int, list[Op]] = {}
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


def _with_seq(op: Op, seq: int) -> Op:
    return Op(seq, op.op, op.nbytes, op.enter_ns, op.end_ns)


def _offset(a: list[PairOp], b: list[PairOp], a_whole: bool, b_whole: bool) -> int:
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

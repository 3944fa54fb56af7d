"""One communicator's members spread over shards, its operations completed where the
shards' parts meet: the step that lets one job's detection run on several workers.

Taking each member's report of each operation is one step per rank and operation
(`CommTracker.ingest`). A data-parallel group over every rank of a job is one communicator,
so spreading a job over workers means spreading its members, not its groups:

- a shard (`ShardComm`, the node stage: the ranks of some nodes) takes its members'
  reports. Once every member it knows ended an operation, it hands on a `SeqPart`: their
  durations and ends, one record however many members;
- the job stage (`SeqMerge`) adds up the parts of each operation, one step per shard, and
  once they cover the communicator completes it in its `CommTracker`, which learns from it
  what it learns from its own reports (`CommTracker.learn`): the shortest, median and
  longest duration, who entered last, when the last member finished, and its sync points.

The same reports give the same completions whatever the number of shards: the durations
are the members' own, the shortest is the lowest-ranked member's among equals (as
``list.index`` finds it), sorts and medians are taken over the merged values. A report of an
operation the shard already handed on is dropped unless its member joined the shard since
(its part comes on its own), as the tracker drops a re-report of a completed operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter, sub
from typing import Any

from streams.core.comm import (
    MAX_COMPLETED,
    MAX_PENDING,
    NOT_YET,
    CommTracker,
    Reach,
    SeqState,
)


@dataclass(frozen=True, slots=True)
class SeqPart:
    """What the members of one shard did in one operation of a communicator."""

    comm: str
    size: int  # the communicator's
    seq: int
    op: str
    nbytes: int
    first_seen_ns: int  # the shard's first report of it
    entered_ns: int  # the report that brought the shard's last entry
    members: tuple[int, ...]  # communicator ranks, ascending
    enters: tuple[int, ...]
    ends: tuple[int, ...]
    inferred: bool  # some member's times stand in for a lost report: nothing to learn


@dataclass(slots=True)
class _Open:
    """One operation the shard's members are in, until all of them ended it."""

    op: str
    nbytes: int
    first_seen_ns: int
    entered_ns: int
    # Members that joined the shard before this many had: in a part handed on already.
    before: int = 0
    enter: dict[int, int] = field(default_factory=dict)
    end: dict[int, int] = field(default_factory=dict)
    inferred: bool = False


class ShardComm:
    """A shard's members of one communicator: their operations until each is ended by
    every member the shard knows, then handed on as a `SeqPart` (`drain`)."""

    def __init__(self, comm: str, size: int) -> None:
        self.comm = comm
        self.size = size
        self.joined: dict[int, int] = {}  # communicator rank -> when it joined (0, 1, ...)
        self.open: dict[int, _Open] = {}
        # Operations handed on, and how many members the shard knew then: a report of one
        # of them by a member that joined later is a part of its own.
        self.handed: dict[int, int] = {}
        self.floor = 0
        # Per member, how far its entries and ends reach with no hole below them
        # (`streams.core.comm.Reach`), and how many operations opened below the newest: one
        # handed on (or given up on) opens again for a member that joined later, and
        # whoever reported it before has a hole there now.
        self.through: dict[int, Reach] = {}
        self.reopened = 0
        self.newest = -1
        self._ready: list[SeqPart] = []
        # The latest end any member reported (at most its report's time): the members'
        # peers were in that operation too (`CommTracker.finished_ns`).
        self.finished_ns = NOT_YET

    def ingest(
        self,
        rank: int,
        ts_ns: int,
        seqs: tuple[int, ...],
        names: tuple[str, ...],
        sizes: tuple[int, ...],
        enters: tuple[int, ...],
        ends: tuple[int | None, ...],
    ) -> None:
        """Take one member's report of its latest operations."""
        joined = self.joined.get(rank)
        if joined is None:
            joined = self.joined[rank] = len(self.joined)
        known = len(self.joined)
        open_ = self.open
        handed = self.handed
        finished = NOT_YET
        for i in range(len(seqs)):  # indexed: compiled, a loop over typed tuples
            seq = seqs[i]
            state = open_.get(seq)
            if state is None:
                if seq < self.floor:
                    continue
                before = handed.get(seq)
                if before is not None and joined < before:
                    continue  # its part left with this member in it: a re-report
                if len(open_) >= MAX_PENDING:
                    del open_[min(open_)]  # bounded: the oldest is given up on
                state = open_[seq] = _Open(names[i], sizes[i], ts_ns, ts_ns, before or 0)
                if seq > self.newest:
                    self.newest = seq
                else:
                    self.reopened += 1
            if rank not in state.enter:
                state.enter[rank] = enters[i]
                state.entered_ns = ts_ns
            end = ends[i]
            if end is None:
                continue
            if end > finished:
                finished = end
            if rank not in state.end:
                state.end[rank] = end
                if len(state.end) + state.before == known:
                    self._hand_on(seq, state)
        if finished != NOT_YET:
            finished = min(finished, ts_ns)  # no report vouches for later than its own time
            if finished > self.finished_ns:
                self.finished_ns = finished
        if not seqs:
            return
        reach = self.through.get(rank)
        if reach is None:
            reach = self.through[rank] = Reach()
        elif reach.runs_on(seqs, ends, self.reopened):
            return  # nothing earlier left out: no open operation to scan
        if open_ and min(open_) < max(seqs):
            self._infer_earlier(rank, seqs, ends, ts_ns)
        reach.scanned(seqs, ends, self.reopened)

    def _infer_earlier(
        self, rank: int, seqs: tuple[int, ...], ends: tuple[int | None, ...], ts_ns: int
    ) -> None:
        """A member past an operation it never reported was in it (a lost report), as
        `CommTracker._infer_earlier` fills it in: its times stand in, nothing is learnt."""
        entered_upto = max(seqs)
        ended_upto = max(
            (seq for seq, end in zip(seqs, ends, strict=True) if end is not None), default=-1
        )
        known = len(self.joined)
        for seq in sorted(s for s in self.open if s < entered_upto):
            state = self.open[seq]
            if rank not in state.enter:
                state.enter[rank] = ts_ns
                state.entered_ns = ts_ns
                state.inferred = True
            if seq < ended_upto and rank not in state.end:
                state.end[rank] = ts_ns
                state.inferred = True
                if len(state.end) + state.before == known:
                    self._hand_on(seq, state)

    def _hand_on(self, seq: int, state: _Open) -> None:
        del self.open[seq]
        self.handed[seq] = len(self.joined)
        if len(self.handed) > MAX_COMPLETED:
            oldest = next(iter(self.handed))
            del self.handed[oldest]
            self.floor = max(self.floor, oldest + 1)
        members = tuple(sorted(state.end))
        self._ready.append(self._part(seq, state, members, _picked(state.end, members)))

    def drain(self) -> list[SeqPart]:
        """The parts handed on since the last call, in the order they completed here."""
        ready, self._ready = self._ready, []
        return ready

    def open_parts(self) -> list[SeqPart]:
        """The operations its members are still in: who entered (and when), who ended
        (`NOT_YET` for those that did not), for the job stage's hang checks."""
        out = []
        for seq, state in self.open.items():
            members = tuple(sorted(state.enter))
            ends = tuple(state.end.get(m, NOT_YET) for m in members)
            out.append(self._part(seq, state, members, ends))
        return out

    def state(self) -> dict[str, Any]:
        """Everything needed to go on after a restart, as plain data (JSON types), between
        two drains (what is handed on waits in no buffer then)."""
        if self._ready:
            message = "a shard's state is taken once what it handed on was drained"
            raise ValueError(message)
        return {
            "comm": self.comm,
            "size": self.size,
            "joined": list(self.joined),  # in the order they joined
            "open": [
                [
                    seq,
                    op.op,
                    op.nbytes,
                    op.first_seen_ns,
                    op.entered_ns,
                    op.before,
                    [[rank, ns] for rank, ns in op.enter.items()],
                    [[rank, ns] for rank, ns in op.end.items()],
                    op.inferred,
                ]
                for seq, op in self.open.items()
            ],
            "handed_runs": handed_runs(self.handed),
            "floor": self.floor,
            "through": [
                [rank, reach.entered_to, reach.ended_to, reach.as_of]
                for rank, reach in self.through.items()
            ],
            "reopened": self.reopened,
            "newest": self.newest,
            "finished_ns": self.finished_ns,
        }

    @classmethod
    def restored(cls, state: dict[str, Any]) -> ShardComm:
        """A shard in the state `state` described."""
        shard = cls(str(state["comm"]), int(state["size"]))
        shard.joined = {int(rank): index for index, rank in enumerate(state["joined"])}
        for seq, op, nbytes, first_seen, entered, before, enter, end, inferred in state["open"]:
            shard.open[int(seq)] = _Open(
                str(op),
                int(nbytes),
                int(first_seen),
                int(entered),
                int(before),
                {int(rank): int(ns) for rank, ns in enter},
                {int(rank): int(ns) for rank, ns in end},
                bool(inferred),
            )
        if "handed_runs" in state:
            shard.handed = handed_of_runs(state["handed_runs"])
        else:  # the first format: one pair a seq
            shard.handed = {int(seq): int(known) for seq, known in state["handed"]}
        shard.floor = int(state["floor"])
        shard.through = {
            int(rank): Reach(int(entered), int(ended), int(as_of))
            for rank, entered, ended, as_of in state["through"]
        }
        shard.reopened = int(state["reopened"])
        shard.newest = int(state["newest"])
        shard.finished_ns = int(state["finished_ns"])
        return shard

    def _part(
        self, seq: int, state: _Open, members: tuple[int, ...], ends: tuple[int, ...]
    ) -> SeqPart:
        return SeqPart(
            self.comm,
            self.size,
            seq,
            state.op,
            state.nbytes,
            state.first_seen_ns,
            state.entered_ns,
            members,
            _picked(state.enter, members),
            ends,
            state.inferred,
        )


@dataclass(slots=True)
class _Merging:
    """The parts of one operation that came so far."""

    first_seen_ns: int
    entered_ns: int
    covered: set[int] = field(default_factory=set)  # the members its parts brought
    parts: list[SeqPart] = field(default_factory=list)
    inferred: bool = False


class SeqMerge:
    """The job stage's side of one communicator: each operation's parts, added up until
    they cover it, then completed in the communicator's tracker."""

    def __init__(self, tracker: CommTracker) -> None:
        self.tracker = tracker
        self.merging: dict[int, _Merging] = {}

    def add(self, part: SeqPart) -> None:
        """Take one shard's part of an operation; complete it once every member is in."""
        tracker = self.tracker
        seq = part.seq
        merging = self.merging.get(seq)
        if merging is None:
            if seq < tracker.floor or seq in tracker.completed:
                return  # a late part of a completed operation
            if len(self.merging) >= MAX_PENDING:
                oldest = min(self.merging)
                del self.merging[oldest]
                tracker.complete_merged(oldest)  # given up on, as the tracker evicts
            merging = self.merging[seq] = _Merging(part.first_seen_ns, part.entered_ns)
        covered = merging.covered
        if not covered.isdisjoint(part.members):
            return  # a member two shards both took (reports routed apart): the first counts
        covered.update(part.members)
        if part.first_seen_ns < merging.first_seen_ns:
            merging.first_seen_ns = part.first_seen_ns
        if part.entered_ns > merging.entered_ns:
            merging.entered_ns = part.entered_ns
        merging.parts.append(part)
        merging.inferred = merging.inferred or part.inferred
        if len(covered) >= tracker.size:
            del self.merging[seq]
            self._complete(seq, merging)

    def rebuild_pending(self, opens: list[SeqPart]) -> None:
        """The tracker's pending operations, as its hang checks read them, from the parts
        merged so far and the shards' open ones (each member's enter and end, or
        `NOT_YET`)."""
        tracker = self.tracker
        size = tracker.size
        pending: dict[int, SeqState] = {}
        for part in [p for m in self.merging.values() for p in m.parts] + opens:
            seq = part.seq
            if seq < tracker.floor or seq in tracker.completed:
                continue
            state = pending.get(seq)
            if state is None:
                state = pending[seq] = SeqState(
                    part.op, part.nbytes, [NOT_YET] * size, [NOT_YET] * size
                )
                state.first_seen_ns = part.first_seen_ns
                state.all_entered_ns = part.entered_ns  # the latest so far (see below)
            elif part.first_seen_ns < state.first_seen_ns:
                state.first_seen_ns = part.first_seen_ns
            if state.all_entered_ns is not None and part.entered_ns > state.all_entered_ns:
                state.all_entered_ns = part.entered_ns
            state.inferred = state.inferred or part.inferred
            enter, end = state.enter, state.end
            for member, entered, ended in zip(part.members, part.enters, part.ends, strict=True):
                if enter[member] == NOT_YET:
                    enter[member] = entered
                    state.entered += 1
                if ended != NOT_YET and end[member] == NOT_YET:
                    end[member] = ended
                    state.ended += 1
        for state in pending.values():
            if state.entered < size:
                state.all_entered_ns = None  # the report that completed entry is yet to come
        tracker.pending = dict(sorted(pending.items()))

    def _complete(self, seq: int, merging: _Merging) -> None:
        tracker = self.tracker
        tracker.complete_merged(seq)
        if merging.inferred:
            return
        parts = merging.parts
        first = parts[0]
        durations: list[int] = []
        shortest_at = (0, 0)  # (shortest duration, its member) of the parts so far
        finished = -1
        for index, part in enumerate(parts):
            mine = list(map(sub, part.ends, part.enters))
            low = min(mine)
            member = part.members[mine.index(low)]
            if index == 0 or (low, member) < shortest_at:
                shortest_at = (low, member)
            high_end = max(part.ends)
            if high_end > finished:
                finished = high_end
            durations.extend(mine)
        shortest, last = shortest_at
        size = tracker.size
        if size == 2:
            longest = max(durations)
            middle: float = 0.0
        else:
            ordered = sorted(durations)
            longest = ordered[-1]
            half = size // 2  # as `CommTracker._complete` takes it (ints, not floats)
            middle = ordered[half] if size % 2 else (ordered[half - 1] + ordered[half]) / 2
        if tracker.learn(seq, first.op, first.nbytes, shortest, longest, middle, last, finished):
            ends = [0] * size
            for part in parts:
                for member, end in zip(part.members, part.ends, strict=True):
                    ends[member] = end
            tracker.syncs.append((seq, ends))


def _picked(values: dict[int, int], members: tuple[int, ...]) -> tuple[int, ...]:
    """The values of these members, in their order (one C call, not a loop per member)."""
    if len(members) == 1:
        return (values[members[0]],)
    picked: tuple[int, ...] = itemgetter(*members)(values)
    return picked


def handed_runs(handed: dict[int, int]) -> list[list[int]]:
    """The operations a shard handed on as runs ``[first seq, count, members known]``, in
    the order they were handed on: a snapshot's size stays that of the runs, not of the
    up to `MAX_COMPLETED` operations a long-running job's shard remembers (they complete in
    order, so a run is most of them)."""
    runs: list[list[int]] = []
    last_seq = last_known = -1
    for seq, known in handed.items():
        if runs and seq == last_seq + 1 and known == last_known:
            runs[-1][1] += 1
        else:
            runs.append([seq, 1, known])
        last_seq, last_known = seq, known
    return runs


def handed_of_runs(runs: list[Any]) -> dict[int, int]:
    """The handed-on operations that `handed_runs` wrote, in their order; a `ValueError`
    for an empty run or more than a shard keeps (not a snapshot of ours)."""
    handed: dict[int, int] = {}
    total = 0
    for first, count, known in runs:
        count = int(count)
        total += count
        # A run of none (or fewer) would let the runs after it pass the bound.
        if count < 1 or total > MAX_COMPLETED:
            message = f"a shard's snapshot hands on runs {count} long, {total} in all"
            raise ValueError(message)
        first, known = int(first), int(known)
        for seq in range(first, first + count):
            handed[seq] = known
    return handed

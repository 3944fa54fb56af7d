"""How long each rank computes, against the ranks that do the same work: who is slow itself.

A straggler spends longer computing between its operations; the ranks it delays spend
longer waiting inside them and compute as long as ever. So a rank's own time outside
communication, measured on its own clock (no clock sync: DESIGN, principle 3), against its
peers' (the members of its collective groups, which run the same layers on the same
microbatches; a point-to-point partner is another pipeline stage and is no peer), names the
straggler and never the ranks waiting for it, in any shape of job.

The unit of comparison is a window between two sync points of one group: operations of that
group that every member leaves at the same moment (a synchronising collective completes
together), one at least ``slice_ns`` after the last. Between them every member spent the same
wall time and ran the same work, each measured on its own clock: its compute time is the
window minus the union of its operations (entered to completed, or still in flight) of every
communicator. A window closes once every communicator of the member has reported past its
end. Each rank is judged in the windows of its largest collective group against the other
members, after what its all-to-all bytes explain (an expert computes in proportion to the
tokens it got, and sends as many back: the busiest expert is load, not hardware; the slope is
fitted across the window's members, robust to a slow one). A window in which it completed no
operation (it stopped: a hang's business) is not judged. A
straggler is a rank whose ratio is high in most of its last judged windows: late
persistently, across iterations; a data loader stall or a hot expert lasts a window or two.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from streams.core.stats import medians_of_others

# Windows kept in a rank's history of verdicts; newer windows of a group after which an
# incomplete one is judged without the members that never reported past it.
VERDICTS_KEPT = 16
SLICE_PATIENCE = 3
# A rank's peers compute at least this share of a slice for the slice to be judged
# (peers waiting the whole slice out say nothing about anybody's speed), unless the rank
# itself computes twice that share: then they wait for it.
MIN_PEER_COMPUTE_SHARE = 0.05
MAX_OPS_KEPT = 8192
# A rank's operation list is pruned once it holds this many (each window scans it).
PRUNE_AT = 256
# The ratio of a rank is this quantile of its judged windows: two thirds of them high.
PERSISTENT_QUANTILE = 0.34
# All-to-all bytes of a window's members must differ by this factor to fit a load slope;
# the fit takes at most this many members (evenly spread by bytes).
MIN_LOAD_SPREAD = 1.02
END_OF_TIME = 1 << 63  # sorts after any (end, bytes) of the same end
MAX_SLOPE_POINTS = 64


@dataclass(slots=True)
class RankTime:
    """One rank's operations on its own clock, until the slices they fall in are closed."""

    ops: list[tuple[int, int]] = field(default_factory=list)  # completed (enter, end)
    in_flight: dict[str, int] = field(default_factory=dict)  # comm -> enter of its open op
    reported: dict[str, int] = field(default_factory=dict)  # comm -> latest report ts
    last_seq: dict[str, int] = field(default_factory=dict)  # comm -> last completed seq
    a2a: list[tuple[int, int]] = field(default_factory=list)  # (end, bytes) of all-to-alls
    # ``ops`` by entry and ``a2a`` by end, so that a window reads only its own part of them
    # (reports of several communicators interleave: sorted again after new ones came).
    ops_ordered: bool = False
    a2a_ordered: bool = False
    # The longest operation in ``ops``: how far before a window to look.
    longest_ns: int = 0


@dataclass(frozen=True, slots=True)
class SliceTime:
    """What one rank did in one slice."""

    compute_ns: int
    a2a_bytes: int
    completed: int  # operations that completed in the slice


@dataclass(frozen=True, slots=True)
class SlowRank:
    """A rank that computes persistently longer than its peers."""

    global_rank: int
    ratio: float  # median over its judged slices of compute / peers' compute
    excess_ns: float  # median extra compute per slice
    slices: int
    since_ns: int  # start of the first slice in its current high run (its clock)


@dataclass(slots=True)
class _Window:
    """One group's window between two sync points, per member: its span and its time."""

    comm: str
    members: tuple[int, ...]  # global ranks
    starts: list[int]
    ends: list[int]
    times: dict[int, SliceTime] = field(default_factory=dict)  # member index -> time
    # Member indexes not timed yet, in order: each check reads only those.
    waiting: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.waiting = list(range(len(self.members)))


class ComputeTracker:
    """Every rank of one job: windows closed, judged against peers, verdicts kept."""

    def __init__(self, slice_ns: int) -> None:
        self.slice_ns = slice_ns
        self.ranks: dict[int, RankTime] = {}
        # comm -> (members, their ends) at its last sync point: the next window's start
        self.last_sync: dict[str, tuple[tuple[int, ...], list[int]]] = {}
        self.windows: list[_Window] = []
        # rank -> recent (end, ratio, excess), ratio None when the window was not judged
        self.verdicts: dict[int, deque[tuple[int, float | None, float]]] = {}
        # Moves whenever a verdict is added: ``slow_ranks`` holds until then (read at
        # every check, for every rank of the job; verdicts come once a window).
        self._verdicts_version = 0
        self._slow: dict[tuple[int, int, float], tuple[int, list[SlowRank]]] = {}
        # Some rank holds PRUNE_AT operations or all-to-alls or more: a prune is due.
        self._piled = False

    # --- input -----------------------------------------------------------------------
    def add(
        self,
        global_rank: int,
        comm: str,
        ts_ns: int,
        seqs: tuple[int, ...],
        ops: tuple[str, ...],
        sizes: tuple[int, ...],
        enters: tuple[int, ...],
        ends: tuple[int | None, ...],
    ) -> None:
        """Take one report of a rank on one communicator."""
        rank = self.ranks.get(global_rank)
        if rank is None:
            rank = self.ranks[global_rank] = RankTime()
        # A report covers its rank's time up to when it was made: its ts, and no earlier
        # than the times it carries (a clock that stamps reports behind its operations).
        count = len(seqs)
        covered = ts_ns
        for i in range(count):
            enter, end = enters[i], ends[i]
            if enter > covered:
                covered = enter
            if end is not None and end > covered:
                covered = end
        if covered <= rank.reported.get(comm, -1):
            return  # a repeated or older report: what it says is known
        rank.reported[comm] = covered
        last = rank.last_seq.get(comm, -1)
        open_enter = None
        kept, longest = rank.ops, rank.longest_ns
        before = len(kept)
        for i in range(count):  # indexed: compiled, a loop over typed tuples
            enter, end = enters[i], ends[i]
            if end is None:
                if open_enter is None:
                    open_enter = enter
                continue
            seq = seqs[i]
            if seq <= last:
                continue
            last = seq
            kept.append((enter, end))
            if end - enter > longest:
                longest = end - enter
            if ops[i] == "alltoall":
                rank.a2a.append((end, sizes[i]))
                rank.a2a_ordered = False
        if len(kept) > before:
            # Several communicators' reports interleave: sorted again when a window reads.
            rank.ops_ordered = False
            rank.longest_ns = longest
            if len(kept) >= PRUNE_AT or len(rank.a2a) >= PRUNE_AT:
                self._piled = True
        rank.last_seq[comm] = last
        if open_enter is not None:
            rank.in_flight[comm] = open_enter
        else:
            rank.in_flight.pop(comm, None)
        if len(rank.ops) > MAX_OPS_KEPT:
            del rank.ops[: len(rank.ops) - MAX_OPS_KEPT]

    def sync(self, comm: str, members: tuple[int, ...], ends: list[int]) -> None:
        """A sync point of a group: the end of one of its operations on every member."""
        previous = self.last_sync.get(comm)
        self.last_sync[comm] = (members, ends)
        if previous is not None and previous[0] == members:
            self.windows.append(_Window(comm, members, previous[1], ends))

    # --- windows ---------------------------------------------------------------------
    def _span(self, rank: RankTime, lo: int, hi: int) -> SliceTime:
        ops = rank.ops
        if not rank.ops_ordered:
            ops.sort()  # nearly sorted already: cheap
            rank.ops_ordered = True
        # Operations that overlap the window entered after lo - longest and before hi.
        first = bisect_left(ops, (lo - rank.longest_ns,))
        stop = bisect_right(ops, (hi, hi))
        # An operation still in flight keeps the rank busy from its entry to the end.
        busy_until = hi
        if rank.in_flight:
            opened = min(rank.in_flight.values())
            if opened < hi:
                busy_until = max(lo, opened)
        busy = hi - busy_until
        cursor = lo
        completed = 0
        for a, b in ops[first:stop]:  # by entry: the union of their intervals in one pass
            if lo < b <= hi:
                completed += 1
            if b <= cursor or a >= busy_until:
                continue
            end = b if b < busy_until else busy_until
            busy += end - (a if a > cursor else cursor)
            cursor = end
        a2a = 0
        if rank.a2a:
            if not rank.a2a_ordered:
                rank.a2a.sort()
                rank.a2a_ordered = True
            ends = rank.a2a
            inside = ends[
                bisect_right(ends, (lo, END_OF_TIME)) : bisect_right(ends, (hi, END_OF_TIME))
            ]
            a2a = sum(n for _, n in inside)
        return SliceTime(max(0, hi - lo - busy), a2a, completed)

    def judge(self) -> None:
        """Close the windows the members' reports have passed; judge the complete ones (or
        those lagging members left behind)."""
        done: list[_Window] = []
        for window in self.windows:
            if not window.waiting:
                continue
            still: list[int] = []
            for i in window.waiting:
                rank = self.ranks.get(window.members[i])
                if rank is not None and min(rank.reported.values()) >= window.ends[i]:
                    window.times[i] = self._span(rank, window.starts[i], window.ends[i])
                else:
                    still.append(i)
            window.waiting = still
        newer: dict[str, int] = {}
        for window in reversed(self.windows):
            complete = len(window.times) == len(window.members)
            behind = newer.get(window.comm, 0)
            if complete or behind >= SLICE_PATIENCE:
                self._judge_window(window)
                done.append(window)
            newer[window.comm] = behind + 1
        if done:
            gone = {id(w) for w in done}
            self.windows = [w for w in self.windows if id(w) not in gone]
        self._prune()

    def _prune(self) -> None:
        """Drop operations no open window (nor the next one) can still need."""
        if not self._piled:
            return  # nothing piled up: not worth finding what is needed
        needed = self._needed_from()
        for member, rank in self.ranks.items():
            keep_from = needed.get(member)
            if keep_from is None:
                continue
            # Rebuilt only when enough has piled up: a window reads the whole list anyway.
            if len(rank.ops) >= PRUNE_AT:
                rank.ops = [(a, b) for a, b in rank.ops if b > keep_from]
            if len(rank.a2a) >= PRUNE_AT:
                rank.a2a = [(b, n) for b, n in rank.a2a if b > keep_from]
        self._piled = self._any_piled()

    def _needed_from(self) -> dict[int, int]:
        """Per rank in an open window or at a group's last sync point, the earliest start
        a window of it can still have: what ended before is read by none."""
        needed: dict[int, int] = {}
        for window in self.windows:
            for member, start in zip(window.members, window.starts, strict=True):
                needed[member] = min(needed.get(member, start), start)
        for members, ends in self.last_sync.values():
            for member, end in zip(members, ends, strict=True):
                needed[member] = min(needed.get(member, end), end)
        return needed

    def _any_piled(self) -> bool:
        return any(
            len(rank.ops) >= PRUNE_AT or len(rank.a2a) >= PRUNE_AT for rank in self.ranks.values()
        )

    def _judge_window(self, window: _Window) -> None:
        times = window.times
        floor = MIN_PEER_COMPUTE_SHARE * self.slice_ns
        slope = _load_slope(list(times.values()))
        # What each member computes beyond what its tokens explain (slope 0 without
        # all-to-alls): a slow GPU stands out, the busiest expert does not.
        judged = list(times.items())
        # Each member's peers as the median of the others' residuals, from one sort of them
        # all: a data-parallel group over every rank of the job has thousands of members.
        peers = medians_of_others([t.compute_ns - slope * t.a2a_bytes for _, t in judged])
        for (i, mine), others in zip(judged, peers, strict=False):  # alone: none judged
            rank = window.members[i]
            self._verdicts_version += 1
            verdicts = self.verdicts.setdefault(rank, deque(maxlen=VERDICTS_KEPT))
            expected = others + slope * mine.a2a_bytes
            end = window.ends[i]
            if mine.completed == 0 or (expected < floor and mine.compute_ns < 2 * floor):
                verdicts.append((end, None, 0.0))
                continue
            # Peers that barely compute say little, unless this rank computes well beyond
            # the floor while they wait for it: then it is judged against the floor.
            verdicts.append(
                (end, mine.compute_ns / max(expected, floor), mine.compute_ns - expected)
            )

    def slow_ranks(self, window: int, least: int, threshold: float) -> list[SlowRank]:
        """Ranks whose median ratio over their last ``window`` judged windows is at least
        ``threshold`` (``least`` of them judged)."""
        asked = (window, least, threshold)
        known = self._slow.get(asked)
        if known is not None and known[0] == self._verdicts_version:
            return list(known[1])
        found = self._slow_ranks(window, least, threshold)
        self._slow[asked] = (self._verdicts_version, found)
        return list(found)

    def _slow_ranks(self, window: int, least: int, threshold: float) -> list[SlowRank]:
        found = []
        for rank, verdicts in self.verdicts.items():
            # The last ``window`` judged ones of those kept: windows of load are skipped.
            recent = [v for v in verdicts if v[1] is not None][-window:]
            if len(recent) < least:
                continue
            # Most of them high, not half: a stall lasts a window or two, a slow GPU all.
            ranked = sorted(v[1] for v in recent if v[1] is not None)
            ratio = ranked[int(len(ranked) * PERSISTENT_QUANTILE)]
            if ratio < threshold:
                continue
            since = recent[-1][0]
            for end, value, _ in reversed(recent):
                if value is None or value < threshold:
                    break
                since = end
            excess = median(v[2] for v in recent)
            found.append(SlowRank(rank, ratio, excess, len(recent), since - self.slice_ns))
        return found

    # --- snapshot ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything needed to go on after a restart, as plain data."""
        # Only what a window can still read (what the next prune keeps): the operations
        # that ended before a rank's earliest open window are most of a large job's state.
        needed = self._needed_from()
        ranks = []
        for r, t in self.ranks.items():
            ops, a2a = t.ops, t.a2a
            keep_from = needed.get(r)
            if keep_from is not None:
                ops = [(a, b) for a, b in ops if b > keep_from]
                a2a = [(b, n) for b, n in a2a if b > keep_from]
            ranks.append([r, ops, t.in_flight, t.reported, t.last_seq, a2a])
        return {
            "slice_ns": self.slice_ns,
            "ranks": ranks,
            "last_sync": {c: [list(m), e] for c, (m, e) in self.last_sync.items()},
            "windows": [
                [
                    w.comm,
                    list(w.members),
                    w.starts,
                    w.ends,
                    [[i, t.compute_ns, t.a2a_bytes, t.completed] for i, t in w.times.items()],
                ]
                for w in self.windows
            ],
            "verdicts": [[r, [list(v) for v in vs]] for r, vs in self.verdicts.items()],
        }

    @classmethod
    def restored(cls, state: dict[str, Any]) -> ComputeTracker:
        """A tracker in the state a snapshot describes."""
        tracker = cls(int(state["slice_ns"]))
        for r, ops, in_flight, reported, last_seq, a2a in state["ranks"]:
            tracker.ranks[int(r)] = RankTime(
                [(int(a), int(b)) for a, b in ops],
                {str(c): int(v) for c, v in in_flight.items()},
                {str(c): int(v) for c, v in reported.items()},
                {str(c): int(v) for c, v in last_seq.items()},
                [(int(b), int(n)) for b, n in a2a],
            )
            kept = tracker.ranks[int(r)].ops
            tracker.ranks[int(r)].longest_ns = max((b - a for a, b in kept), default=0)
        tracker.last_sync = {
            str(c): (tuple(int(m) for m in members), [int(e) for e in ends])
            for c, (members, ends) in state["last_sync"].items()
        }
        for comm, members, starts, ends, times in state["windows"]:
            window = _Window(str(comm), tuple(int(m) for m in members), starts, ends)
            window.times = {int(i): SliceTime(int(c), int(a), int(n)) for i, c, a, n in times}
            window.waiting = [i for i in range(len(window.members)) if i not in window.times]
            tracker.windows.append(window)
        for r, verdicts in state["verdicts"]:
            tracker.verdicts[int(r)] = deque(
                ((int(k), None if v is None else float(v), float(e)) for k, v, e in verdicts),
                maxlen=VERDICTS_KEPT,
            )
        tracker._piled = tracker._any_piled()
        return tracker


def _load_slope(times: list[SliceTime]) -> float:
    """Compute time per all-to-all byte across a window's members: the median of the
    pairwise slopes (robust to a slow member), 0 when their bytes hardly differ."""
    points = sorted((t.a2a_bytes, t.compute_ns) for t in times)
    if len(points) < 3 or points[0][0] <= 0 or points[-1][0] < points[0][0] * MIN_LOAD_SPREAD:
        return 0.0
    step = max(1, len(points) // MAX_SLOPE_POINTS)
    sample = points[::step]
    slopes = [
        (c2 - c1) / (b2 - b1)
        for i, (b1, c1) in enumerate(sample)
        for b2, c2 in sample[i + 1 :]
        if b2 > b1
    ]
    return max(0.0, median(slopes)) if slopes else 0.0

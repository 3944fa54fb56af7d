"""One communicator of one job: its operations by ``seq``, and what their timing says.

Durations (end - enter) of the same ``seq`` are compared across members, never enter
timestamps from different hosts (DESIGN, principle 3): the member that entered last has the
shortest duration, and that shortest duration is the pure communication time.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field
from operator import sub
from typing import Any

from schemas.messages import Collective
from streams.core.params import DetectorParams
from streams.core.stats import Baseline, Window

MAX_PENDING = 4096
MAX_COMPLETED = 8192
NO_SEQ = -2  # no report of the member taken yet (seqs are never negative)
# A slowdown is judged every this many completed operations of one kind.
SLOW_EVERY_OPS = 2
# What ``recent_of`` reads of each rank: its last samples, as many as this many reports
# of this many peers each bring.
RECENT_INTERVALS = 3
CONNS_PER_REPORT = 4
# Connection samples a snapshot keeps per rank: all that ``recent_of`` reads at most.
CONN_KEEP = RECENT_INTERVALS * CONNS_PER_REPORT
NOT_YET = -1
# A compute window holds at least this many of its group's operations (or sync_every_ns).
SYNC_PERIODS = 4
CONN_SAMPLES = 64  # connection samples kept per rank (all peers)
CONN_LOG_KEPT = 1024  # connection reports a group remembers the rank of, beyond its size


@dataclass(slots=True)
class SeqState:
    """What the members reported of one operation so far."""

    op: str
    nbytes: int
    enter: list[int]
    end: list[int]
    entered: int = 0
    ended: int = 0
    first_seen_ns: int = 0
    all_entered_ns: int | None = None
    # Some rank's enter or end was inferred, not reported (a lost report): no durations.
    inferred: bool = False


@dataclass(frozen=True, slots=True)
class Hang:
    """An operation without progress: who never entered it, or that none could finish."""

    kind: str  # "noncomm" (some never entered) or "comm" (all entered, not all finished)
    seq: int
    since_ns: int
    missing: tuple[int, ...]  # communicator ranks that never entered (noncomm)
    unfinished: tuple[int, ...]  # communicator ranks that entered and did not finish


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Operations slower than the communicator's baseline, members entering on time."""

    op: str
    factor: float
    baseline_ns: float
    recent_ns: float
    since_ns: int


@dataclass(frozen=True, slots=True)
class ConnSample:
    """One connection's traffic in one reporting interval."""

    rank: int
    peer: int
    port: str
    nbytes: int
    busy_ns: int
    ts_ns: int = 0  # the report's time (0: from a snapshot older than this field)


@dataclass(slots=True)
class Reach:
    """How far a member's entries and ends reach with no hole below them: every operation
    still open up to ``entered_to`` (``ended_to``) has its entry (end) from the member, as of
    ``as_of`` operations first opened below a later one (one that opens so voids it: who
    was ahead lost its report, and this member may have passed it before it opened)."""

    entered_to: int = NO_SEQ
    ended_to: int = NO_SEQ
    as_of: int = 0

    def runs_on(self, seqs: tuple[int, ...], ends: tuple[int | None, ...], opened: int) -> bool:
        """Whether a report leaves no hole (`reports_through`): then it moves the reach on,
        and the open operations need no scan for lost reports."""
        if self.as_of != opened:
            return False
        through = reports_through(seqs, ends, self.entered_to, self.ended_to)
        if through is None:
            return False
        if through[0] > self.entered_to:
            self.entered_to = through[0]
        if through[1] > self.ended_to:
            self.ended_to = through[1]
        return True

    def scanned(self, seqs: tuple[int, ...], ends: tuple[int | None, ...], opened: int) -> None:
        """The open operations were scanned for this report's holes (or none was open
        below it): what the report reached holds."""
        self.entered_to = max(seqs)
        self.ended_to = last_ended(seqs, ends)
        self.as_of = opened


@dataclass(slots=True)
class Member:
    """What is known of one member: where it runs and when it was last heard from."""

    global_rank: int | None = None
    node: str | None = None
    gpu: int | None = None
    port: str | None = None
    last_seen_ns: int = NOT_YET
    reach: Reach = field(default_factory=Reach)


@dataclass(slots=True)
class CommTracker:
    """Timing state of one communicator."""

    job: str
    comm: str
    size: int
    params: DetectorParams
    members: list[Member] = field(init=False)
    pending: dict[int, SeqState] = field(default_factory=dict)
    # Completed seqs (bounded, oldest first) and the floor below which every seq is done:
    # a late re-report of a finished operation must not open it again as a ghost.
    completed: dict[int, None] = field(default_factory=dict)
    floor: int = 0
    # The latest seq opened, and how many opened below it: an operation first reported
    # after later ones (their reports came first, or one was lost) may be a hole of a member
    # that reported past it before it was open (its `Reach` holds no more).
    newest_seq: int = -1
    opened_below: int = 0
    spans: Window = field(init=False)
    last_entrants: deque[tuple[int, float, int]] = field(init=False)
    baselines: dict[tuple[str, int], Baseline] = field(default_factory=dict)
    slow_since: dict[tuple[str, int], int] = field(default_factory=dict)
    fresh_samples: dict[tuple[str, int], int] = field(default_factory=dict)
    conns: dict[int, deque[ConnSample]] = field(default_factory=dict)
    ops_seen: int = 0
    periods: Window = field(init=False)
    last_end_ns: int | None = None
    # The latest time a member was seen finishing an operation (its end, at most its
    # report's time). Every member took part in it: a member whose own reports stop before
    # that is behind (an agent's spool not yet replayed), not silent.
    finished_ns: int = NOT_YET
    # Sync points for the compute tracker: every ``sync_every_ns`` (0: none), a completed
    # operation's end on every member's clock (all members leave it together).
    sync_every_ns: int = 0
    last_sync_ns: int | None = None
    syncs: list[tuple[int, list[int]]] = field(default_factory=list)
    # Counts the reports that brought connection samples, in all and per rank: what was
    # computed from a rank's samples holds until its count moves.
    conn_version: int = 0
    conn_reports: dict[int, int] = field(default_factory=dict)
    # The rank of each such report, in order (report ``conn_log_from + 1`` first): which
    # ranks reported since a reader last looked, without reading every rank. Bounded: a
    # reader further behind than what is kept reads them all.
    conn_log: list[int] = field(default_factory=list)
    conn_log_from: int = 0
    # rank -> peer -> throughputs (bytes/ns) of its kept samples that moved data, sorted:
    # a connection's own past as a quantile without sorting every sample at each vote.
    conn_sorted: dict[int, dict[int, list[float]]] = field(default_factory=dict)
    # Moves when a member's rank, node, GPU or port changes: what was read of the places holds.
    place_version: int = 0
    # The latest report of any member; per node its members reported (their own ``node``),
    # the latest of theirs; the members heard from that never said their node. Kept as the
    # reports come, so that liveness is read per node at each check, not per member.
    latest_seen_ns: int = NOT_YET
    seen_by_node: dict[str, int] = field(default_factory=dict)
    nodeless: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.members = [Member() for _ in range(self.size)]
        self.spans = Window(64)
        self.periods = Window(64)
        self.last_entrants = deque(maxlen=self.params.straggler_window)

    def ingest(self, message: Collective) -> None:
        """Take one rank's report: its liveness, places, operations and connections."""
        self.take_seen(message.rank, message.ts_ns, message.global_rank, message.node, message.gpu)
        self._take_ops(message)
        conns = message.conns
        if conns is not None:
            self.take_conns(
                message.rank, message.ts_ns, conns.peer, conns.port, conns.bytes, conns.busy_ns
            )

    def take_seen(
        self, rank: int, ts_ns: int, global_rank: int, node: str | None, gpu: int | None
    ) -> None:
        """A member reported at ``ts_ns`` (its liveness) from where it runs (its place)."""
        member = self.members[rank]
        if ts_ns > member.last_seen_ns:
            member.last_seen_ns = ts_ns
            if ts_ns > self.latest_seen_ns:
                self.latest_seen_ns = ts_ns
        if member.global_rank != global_rank:
            member.global_rank = global_rank
            self.place_version += 1
        if node is not None and member.node != node:
            moved = member.node is not None
            member.node = node
            self.place_version += 1
            if moved:
                self._rebuild_seen()  # its old node holds its reports no more
            else:
                self.nodeless.discard(rank)
        placed = member.node
        if placed is None:
            self.nodeless.add(rank)
        elif member.last_seen_ns > self.seen_by_node.get(placed, NOT_YET):
            self.seen_by_node[placed] = member.last_seen_ns
        if gpu is not None and member.gpu != gpu:
            member.gpu = gpu
            self.place_version += 1

    def _take_ops(self, message: Collective) -> None:
        rank = message.rank
        ops = message.ops
        ts_ns = message.ts_ns
        seqs: tuple[int, ...] = ops.seq
        names: tuple[str, ...] = ops.op
        sizes: tuple[int, ...] = ops.bytes
        enters: tuple[int, ...] = ops.enter_ns
        ends: tuple[int | None, ...] = ops.end_ns
        count = len(seqs)
        if not len(names) == len(sizes) == len(enters) == len(ends) == count:
            msg = f"ops arrays of unequal lengths in a report of rank {rank}"
            raise ValueError(msg)  # the contract rejects such a report before it gets here
        pending = self.pending
        completed = self.completed
        size = self.size
        finished = NOT_YET
        # The hot loop of the detector: one iteration per reported operation, kept inline
        # and indexed (compiled, a loop over typed tuples; opening an operation too; only
        # the eviction of the oldest calls out).
        for i in range(count):
            seq = seqs[i]
            state = pending.get(seq)
            if state is None:
                if seq < self.floor or seq in completed:
                    continue  # a late re-report of a finished operation
                if len(pending) >= MAX_PENDING:
                    self._evict_oldest()
                state = pending[seq] = SeqState(
                    names[i], sizes[i], [NOT_YET] * size, [NOT_YET] * size
                )
                state.first_seen_ns = ts_ns
                if seq > self.newest_seq:
                    self.newest_seq = seq
                else:
                    self.opened_below += 1
            state_enters = state.enter
            if state_enters[rank] == NOT_YET:
                state_enters[rank] = enters[i]
                state.entered += 1
                if state.entered == size:
                    state.all_entered_ns = ts_ns
            end = ends[i]
            if end is not None:
                if end > finished:
                    finished = end
                state_ends = state.end
                if state_ends[rank] == NOT_YET:
                    state_ends[rank] = end
                    state.ended += 1
                    if state.ended == size:
                        self._complete(seq, state)
        if finished != NOT_YET:
            finished = min(finished, ts_ns)  # no report vouches for later than its own time
            if finished > self.finished_ns:
                self.finished_ns = finished
        if count == 0:
            return
        reach = self.members[rank].reach
        if reach.runs_on(seqs, ends, self.opened_below):
            return  # nothing earlier left out: no pending operation to scan
        if pending and min(pending) < max(seqs):
            self._infer_earlier(rank, seqs, ends, ts_ns)
        reach.scanned(seqs, ends, self.opened_below)

    def take_conns(
        self,
        rank: int,
        ts_ns: int,
        peers: tuple[int, ...],
        ports: tuple[str, ...],
        sizes: tuple[int, ...],
        busy: tuple[int, ...],
    ) -> None:
        """A member's connection samples of one report (made at ``ts_ns``)."""
        member = self.members[rank]
        self.conn_version += 1
        self.conn_reports[rank] = self.conn_reports.get(rank, 0) + 1
        log = self.conn_log
        log.append(rank)
        if len(log) > CONN_LOG_KEPT + 2 * self.size:
            dropped = len(log) - self.size - CONN_LOG_KEPT // 2
            del log[:dropped]
            self.conn_log_from += dropped
        samples = self.conns.setdefault(rank, deque(maxlen=CONN_SAMPLES))
        ordered = self.conn_sorted.setdefault(rank, {})
        for peer, port, nbytes, took in zip(peers, ports, sizes, busy, strict=True):
            if len(samples) == CONN_SAMPLES:
                _unsort(ordered, samples[0])  # the sample the deque drops now
            samples.append(ConnSample(rank, peer, port, nbytes, took, ts_ns))
            if took > 0:
                insort(ordered.setdefault(peer, []), nbytes / took)
            if member.port is None:
                member.port = port
                self.place_version += 1

    def _rebuild_seen(self) -> None:
        """Each node's latest report and the members without a node, from the members."""
        self.seen_by_node = {}
        self.nodeless = set()
        latest = NOT_YET
        for index, member in enumerate(self.members):
            seen = member.last_seen_ns
            if seen > latest:
                latest = seen
            if seen < 0:
                continue
            if member.node is None:
                self.nodeless.add(index)
            elif seen > self.seen_by_node.get(member.node, NOT_YET):
                self.seen_by_node[member.node] = seen
        self.latest_seen_ns = latest

    def _infer_earlier(
        self, rank: int, seqs: tuple[int, ...], ends: tuple[int | None, ...], ts_ns: int
    ) -> None:
        """Fill in what a lost report of this rank said about earlier operations.

        Operations of one communicator are entered, and finish, in order on every rank: a
        rank that entered (finished) an operation entered (finished) every earlier one. A
        report lost on the way (an agent killed before delivering it, a detector restored
        from a snapshot older than its committed offsets) would otherwise leave an earlier
        operation waiting for this rank forever: a hang that is none.
        """
        entered_upto = max(seqs)
        ended_upto = max(
            (seq for seq, end in zip(seqs, ends, strict=True) if end is not None), default=-1
        )
        holes = [
            seq
            for seq, state in self.pending.items()
            if seq < entered_upto
            and (state.enter[rank] == NOT_YET or (seq < ended_upto and state.end[rank] == NOT_YET))
        ]
        for seq in sorted(holes):  # usually none: the rank reported every earlier one
            state = self.pending[seq]
            if state.enter[rank] == NOT_YET:
                state.enter[rank] = ts_ns
                state.entered += 1
                state.inferred = True
                if state.entered == self.size:
                    state.all_entered_ns = ts_ns
            if seq < ended_upto and state.end[rank] == NOT_YET:
                state.end[rank] = ts_ns
                state.ended += 1
                state.inferred = True
                if state.ended == self.size:
                    self._complete(seq, state)

    def _evict_oldest(self) -> None:
        """Bounded memory: the oldest unfinished operation is given up on."""
        oldest = min(self.pending)
        del self.pending[oldest]
        self._mark_done(oldest)

    def _mark_done(self, seq: int) -> None:
        self.completed[seq] = None
        if len(self.completed) > MAX_COMPLETED:
            oldest = next(iter(self.completed))
            del self.completed[oldest]
            self.floor = max(self.floor, oldest + 1)

    def _complete(self, seq: int, state: SeqState) -> None:
        del self.pending[seq]
        self._mark_done(seq)
        self.ops_seen += 1
        if state.inferred:
            return  # some of its times are stand-ins: nothing to learn from its durations
        ends = state.end
        durations = list(map(sub, ends, state.enter))
        if self.size == 2:  # a point-to-point pair: the most common by far, no sort
            first, second = durations
            shortest, longest = (first, second) if first <= second else (second, first)
            finished = ends[0] if ends[0] >= ends[1] else ends[1]
            middle: float = 0.0
            last = 0
        else:
            ordered = sorted(durations)  # one sort: shortest, median and longest from it
            shortest, longest = ordered[0], ordered[-1]
            finished = max(ends)
            half = self.size // 2
            middle = ordered[half] if self.size % 2 else (ordered[half - 1] + ordered[half]) / 2
            last = durations.index(shortest)
        if self.learn(seq, state.op, state.nbytes, shortest, longest, middle, last, finished):
            self.syncs.append((seq, list(ends)))

    def complete_merged(self, seq: int) -> None:
        """An operation the shards of its members completed (`streams.core.shard`): done
        here, learnt from by whoever merged it (`learn`), never opened here again."""
        self.pending.pop(seq, None)
        self._mark_done(seq)
        self.ops_seen += 1

    def learn(
        self,
        seq: int,
        op: str,
        nbytes: int,
        shortest: int,
        longest: int,
        middle: float,
        last: int,
        finished: int,
    ) -> bool:
        """Learn from a completed operation: its members' shortest, median (``middle``)
        and longest duration, which member was shortest (``last``: it entered last) and
        when the last member finished. Whether it is a sync point (the caller adds its
        members' ends to ``syncs``)."""
        self.spans.add(longest)
        if self.last_end_ns is not None and finished > self.last_end_ns:
            self.periods.add(finished - self.last_end_ns)
        self.last_end_ns = finished
        sync = bool(self.sync_every_ns) and self._sync_due(finished)
        if sync:
            self.last_sync_ns = finished
        if self.size > 2:
            self.last_entrants.append((last, middle - shortest, finished))
        key = (op, nbytes.bit_length())
        baseline = self.baselines.get(key)
        if baseline is None:
            baseline = Baseline(self.params.slow_baseline_ops, self.params.slow_recent_ops)
            self.baselines[key] = baseline
        baseline.add(shortest)
        fresh = self.fresh_samples.get(key, 0) + 1
        if fresh >= SLOW_EVERY_OPS:
            fresh = 0
            self._judge_slowdown(key, baseline, finished)
        self.fresh_samples[key] = fresh
        return sync

    def _sync_due(self, finished: int) -> bool:
        """Whether an operation that finished at ``finished`` is the next sync point.

        Every ``sync_every_ns``; sooner, down to half of it, once ``SYNC_PERIODS`` of the
        group's operations have passed: a compute window needs enough iterations to
        average their noise out, not a fixed time, and a job that iterates fast is then
        judged in as many iterations as a slow one (a straggler named in fewer operations).
        """
        if self.last_sync_ns is None:
            return True
        gap = finished - self.last_sync_ns
        if gap >= self.sync_every_ns:
            return True
        if gap < self.sync_every_ns // 2:
            return False
        period = self.periods.median()
        return period is not None and gap >= SYNC_PERIODS * period

    def median_op_ns(self) -> float | None:
        """The typical wall span of an operation of this communicator."""
        return self.spans.median()

    def unfinished_oldest(self) -> int | None:
        """The oldest pending operation no member finished yet.

        One member finished it, so every member took part in it (a collective finishes on
        none while one is missing): whoever has not reported entering or finishing it did,
        and those reports are behind (a node's spool replayed after the others', a report
        lost on the way that a later one fills in), not a hang.
        """
        if not self.pending:
            return None
        seq = min(self.pending)
        if self.pending[seq].ended == 0:
            return seq  # the usual case: nothing finished is waiting for late reports
        for seq in sorted(self.pending):
            if self.pending[seq].ended == 0:
                return seq
        return None

    def hang(self, now_ns: int, share: float = 1.0) -> Hang | None:
        """The oldest operation without progress for ``share`` x ``hang_after``, if any (of
        those no member finished: see `unfinished_oldest`)."""
        seq = self.unfinished_oldest()
        if seq is None:
            return None
        hang_after = int(self.params.hang_after_ns(self.median_op_ns()) * share)
        state = self.pending[seq]
        if state.entered < self.size:
            if now_ns - state.first_seen_ns < hang_after:
                return None
            missing = tuple(r for r, t in enumerate(state.enter) if t == NOT_YET)
            unfinished = tuple(
                r for r in range(self.size) if state.enter[r] != NOT_YET and state.end[r] == NOT_YET
            )
            return Hang("noncomm", seq, state.first_seen_ns, missing, unfinished)
        since = state.all_entered_ns if state.all_entered_ns is not None else state.first_seen_ns
        if now_ns - since < hang_after:
            return None
        unfinished = tuple(r for r, t in enumerate(state.end) if t == NOT_YET)
        return Hang("comm", seq, since, (), unfinished)

    def _judge_slowdown(self, key: tuple[str, int], baseline: Baseline, at_ns: int) -> None:
        """Open or close the slowdown of one operation kind, as of a completed operation.

        Judged as the samples come, every ``SLOW_EVERY_OPS`` of them, not on the clock's
        ticks: the window in which a step change is visible (before the baseline takes the
        new samples in) is a few operations long, and a burst of reports (a backlog, a
        batch) must not slide through it unjudged.
        """
        if not baseline.ready():
            return
        recent = baseline.recent()
        open_since = self.slow_since.get(key)
        if open_since is None and recent <= baseline.low() * self.params.slow_factor:
            return  # not slow against any reference at or above the low bound: nothing opens
        reference = baseline.baseline()
        factor = (
            self.params.slow_resolve_factor if open_since is not None else self.params.slow_factor
        )
        if reference > 0 and recent > reference * factor:
            if open_since is None:
                baseline.freeze()
                self.slow_since[key] = at_ns
        elif open_since is not None:
            baseline.thaw()
            del self.slow_since[key]

    def slowdowns(self) -> list[Slowdown]:
        """Operation kinds whose recent transfer time is over the baseline by the slow factor."""
        found = []
        for key, since in self.slow_since.items():
            baseline = self.baselines[key]
            reference, recent = baseline.baseline(), baseline.recent()
            factor = recent / reference if reference > 0 else 0.0
            found.append(Slowdown(key[0], factor, reference, recent, since))
        return found

    # --- snapshot ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything the detectors need to go on after a restart, as plain data.

        Completed seqs are kept as a floor (operations of a communicator complete in
        order); connection samples only as many as ``recent_conns`` ever reads.
        """
        done = max(self.completed, default=self.floor - 1)
        return {
            "size": self.size,
            "members": [
                [m.global_rank, m.node, m.gpu, m.port, m.last_seen_ns] for m in self.members
            ],
            "pending": [
                [
                    seq,
                    st.op,
                    st.nbytes,
                    st.enter,
                    st.end,
                    st.first_seen_ns,
                    st.all_entered_ns,
                    st.inferred,
                ]
                for seq, st in self.pending.items()
            ],
            "floor": max(self.floor, done + 1),
            "spans": self.spans.state(),
            "periods": self.periods.state(),
            "last_entrants": [list(entry) for entry in self.last_entrants],
            "baselines": [[op, bucket, b.state()] for (op, bucket), b in self.baselines.items()],
            "slow_since": [[op, bucket, ns] for (op, bucket), ns in self.slow_since.items()],
            "fresh": [[op, bucket, n] for (op, bucket), n in self.fresh_samples.items()],
            "conns": [
                [
                    [s.rank, s.peer, s.port, s.nbytes, s.busy_ns, s.ts_ns]
                    for s in list(samples)[-CONN_KEEP:]
                ]
                for samples in self.conns.values()
            ],
            "ops_seen": self.ops_seen,
            "last_end_ns": self.last_end_ns,
            "finished_ns": self.finished_ns,
            "sync": [self.sync_every_ns, self.last_sync_ns, [[q, e] for q, e in self.syncs]],
        }

    @classmethod
    def restored(
        cls, job: str, comm: str, params: DetectorParams, state: dict[str, Any]
    ) -> CommTracker:
        """A tracker in the state a snapshot describes."""
        tracker = cls(job, comm, state["size"], params)
        for member, (global_rank, node, gpu, port, seen) in zip(
            tracker.members, state["members"], strict=True
        ):
            member.global_rank, member.node, member.gpu = global_rank, node, gpu
            member.port, member.last_seen_ns = port, seen
        tracker._rebuild_seen()
        for seq, op, nbytes, enter, end, first_seen, all_entered, *rest in state["pending"]:
            entered = sum(1 for t in enter if t != NOT_YET)
            ended = sum(1 for t in end if t != NOT_YET)
            inferred = bool(rest[0]) if rest else False
            tracker.pending[seq] = SeqState(
                op, nbytes, enter, end, entered, ended, first_seen, all_entered, inferred
            )
        tracker.floor = state["floor"]
        tracker.spans.restore(state["spans"])
        tracker.periods.restore(state["periods"])
        tracker.last_entrants.extend(tuple(entry) for entry in state["last_entrants"])
        for op, bucket, baseline_state in state["baselines"]:
            baseline = Baseline(params.slow_baseline_ops, params.slow_recent_ops)
            baseline.restore(baseline_state)
            tracker.baselines[(op, bucket)] = baseline
        tracker.slow_since = {(op, bucket): ns for op, bucket, ns in state["slow_since"]}
        tracker.fresh_samples = {(op, bucket): n for op, bucket, n in state["fresh"]}
        for samples in state["conns"]:
            if samples:
                kept = tracker.conns[samples[0][0]] = deque(
                    (ConnSample(*sample) for sample in samples), maxlen=CONN_SAMPLES
                )
                ordered = tracker.conn_sorted[samples[0][0]] = {}
                for sample in kept:
                    if sample.busy_ns > 0:
                        insort(ordered.setdefault(sample.peer, []), sample.nbytes / sample.busy_ns)
        tracker.ops_seen = state["ops_seen"]
        tracker.last_end_ns = state["last_end_ns"]
        tracker.finished_ns = int(state.get("finished_ns", NOT_YET))
        if "sync" in state:
            every, last, syncs = state["sync"]
            tracker.sync_every_ns, tracker.last_sync_ns = int(every), last
            tracker.syncs = [(int(q), [int(e) for e in ends]) for q, ends in syncs]
        return tracker

    def conn_ranks_since(self, version: int) -> set[int] | None:
        """The ranks that reported connections after ``conn_version`` was ``version``;
        None when that is further back than the tracker remembers."""
        if version < self.conn_log_from or version > self.conn_version:
            return None
        return set(self.conn_log[version - self.conn_log_from :])

    def conn_history(self) -> list[ConnSample]:
        """Every connection sample kept, of every rank."""
        return [sample for samples in self.conns.values() for sample in samples]

    def recent_of(self, rank: int, intervals: int = RECENT_INTERVALS) -> list[ConnSample]:
        """One rank's connection samples of its last few reports."""
        return list(self.conns.get(rank, ()))[-intervals * CONNS_PER_REPORT :]

    def recent_conns(self, intervals: int = RECENT_INTERVALS) -> list[ConnSample]:
        """Each rank's connection samples of its last few reports."""
        return [sample for rank in self.conns for sample in self.recent_of(rank, intervals)]


def last_ended(seqs: tuple[int, ...], ends: tuple[int | None, ...]) -> int:
    """The latest seq a report says ended (-1: none)."""
    latest = -1
    for i in range(len(seqs)):
        if ends[i] is not None and seqs[i] > latest:
            latest = seqs[i]
    return latest


def reports_through(
    seqs: tuple[int, ...], ends: tuple[int | None, ...], entered_to: int, ended_to: int
) -> tuple[int, int] | None:
    """How far a member's entries and ends reach with this report, when it leaves no hole
    below them: its seqs run on one by one from what the member entered before
    (``entered_to``), and every one of them past what it ended before (``ended_to``) and
    below its last end ended too. None when it may leave one (or nothing is known of the
    member yet): then the pending operations are scanned for them (`_infer_earlier`).

    The caller keeps that a pending operation up to ``entered_to`` (``ended_to``) has
    this member's entry (end) already: a done one does not open again (it is kept as
    done), and one first opened below a later one since the member's last scan (who was
    ahead lost its report) voids the reach (`CommTracker.opened_below`). So whatever this
    report does not cover is not pending. O(the report), where the scan is O(every
    pending operation), which is many in a large group (its members spread out over more
    operations).
    """
    count = len(seqs)
    if entered_to == NO_SEQ or count == 0:
        return None
    first = seqs[0]
    if first > entered_to + 1:
        return None
    ended = -1
    for i in range(count):
        if seqs[i] != first + i:
            return None
        if ends[i] is not None:
            ended = first + i
    if ended > ended_to + 1:
        if first > ended_to + 1:
            return None
        for i in range(ended - first):
            if first + i > ended_to and ends[i] is None:
                return None
    return first + count - 1, ended


def _unsort(ordered: dict[int, list[float]], sample: ConnSample) -> None:
    """Take a dropped sample's throughput out of its connection's sorted values."""
    if sample.busy_ns <= 0:
        return
    values = ordered[sample.peer]
    del values[bisect_left(values, sample.nbytes / sample.busy_ns)]

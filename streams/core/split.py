"""The node stage of one job's detection, and what it hands the job stage.

A job spread over workers (issue 34) is read in two stages. The node stage takes the
collective reports of some nodes' ranks: the per-operation work, one step per rank and
operation, is done there (`streams.core.shard`). At each barrier it hands the job stage,
per job, a `JobShare`: the parts of the operations its members completed, the operations
they are still in, each member's latest report and place, the reports' times, their
operations (for the compute windows) and connection samples, as rows. No report crosses:
the job stage reads only these.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from schemas.messages import Collective, Collectives
from streams.core.comm import NOT_YET
from streams.core.rows import ConnRow, OpsRow, SeenRow
from streams.core.shard import SeqPart, ShardComm


def part_row(part: SeqPart) -> tuple[Any, ...]:
    """A part as plain data."""
    return (
        part.comm,
        part.size,
        part.seq,
        part.op,
        part.nbytes,
        part.first_seen_ns,
        part.entered_ns,
        part.members,
        part.enters,
        part.ends,
        part.inferred,
    )


def part_of_row(row: tuple[Any, ...] | list[Any]) -> SeqPart:
    """The part a `part_row` holds (its sequences tuples again, as JSON gives lists)."""
    comm, size, seq, op, nbytes, first_seen, entered, members, enters, ends, inferred = row
    return SeqPart(
        comm,
        size,
        seq,
        op,
        nbytes,
        first_seen,
        entered,
        tuple(members),
        tuple(enters),
        tuple(ends),
        inferred,
    )


@dataclass(frozen=True, slots=True)
class JobShare:
    """What one node stage hands the job stage of one job at a barrier: no report, only
    what the job stage reads of them."""

    job: str
    run: int | None  # the latest restart count its reports said (None: none said one)
    times: tuple[int, ...]  # its reports' times, in order (the job's liveness)
    seen: tuple[SeenRow, ...]  # each member's latest report of the interval
    conns: tuple[ConnRow, ...]  # connection samples, report by report
    parts: tuple[SeqPart, ...]  # operations its members completed, in the order they did
    opens: tuple[SeqPart, ...]  # operations its members are still in
    finished: tuple[tuple[str, int], ...]  # (comm, latest end its members reported)
    agents: tuple[tuple[str, int], ...]  # (node, ts) of each batch that named its node
    spans: tuple[OpsRow, ...]  # each report's operations, for the compute windows
    # (input position, comm, size) of the groups first met here: the job stage makes its
    # trackers in the input's order (what its checks go through them in).
    met: tuple[tuple[int, str, int], ...]


@dataclass(slots=True)
class _NodeJob:
    comms: dict[str, ShardComm] = field(default_factory=dict)
    spans: list[OpsRow] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    seen: dict[tuple[str, int], SeenRow] = field(default_factory=dict)
    conns: list[ConnRow] = field(default_factory=list)
    agents: list[tuple[str, int]] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # groups with reports since the barrier
    # The groups met here so far, and those met since the barrier (`JobShare.met`).
    known: set[str] = field(default_factory=set)
    met: list[tuple[int, str, int]] = field(default_factory=list)
    # The run its reports are of (the latest restart count a report or a member report
    # said), and whether a report said it since the barrier.
    run: int = -1
    run_said: bool = False
    latest_ns: int = NOT_YET  # the latest event time taken since the barrier


class NodeStage:
    """The collective reports of some nodes' ranks, per job and group, until a barrier."""

    def __init__(self) -> None:
        self._jobs: dict[str, _NodeJob] = {}
        # The latest event time of what it took since the last barrier (`event_time`).
        self.latest_ns = NOT_YET

    def on_message(self, message: Collective | Collectives, position: int = 0) -> None:
        """Take one report, or one node's batch of them; ``position``: where it is in the
        input (its line), so that the job stage meets the groups in the input's order."""
        latest = event_time(message)
        if latest > self.latest_ns:
            self.latest_ns = latest
        if isinstance(message, Collectives):
            for each in message.messages:
                self._take(each, position)
            if message.node is not None:
                self._job(message.job).agents.append((message.node, message.ts_ns))
        else:
            self._take(message, position)

    def _job(self, job: str) -> _NodeJob:
        state = self._jobs.get(job)
        if state is None:
            state = self._jobs[job] = _NodeJob()
        return state

    def on_run(self, job: str, restart: int) -> None:
        """A member report said the job runs as ``restart`` now (before any report of that
        run, possibly): reports of an earlier run are left out from here on."""
        state = self._job(job)
        if restart > state.run:
            self._new_run(state, restart)

    @staticmethod
    def _new_run(state: _NodeJob, restart: int) -> None:
        # The run before's operations are no evidence about this one (its sequences
        # start again): its groups' shards go. The first run said is the one
        # the reports so far are of.
        if state.run >= 0:
            state.comms = {}
        state.run = restart

    def _take(self, message: Collective, position: int) -> None:
        state = self._job(message.job)
        if message.ts_ns > state.latest_ns:
            state.latest_ns = message.ts_ns
        restart = message.restart
        if restart is not None:
            if restart < state.run:
                return  # of a run the job left: the job stage never sees it
            if restart > state.run:
                self._new_run(state, restart)
            state.run_said = True
        comm = state.comms.get(message.comm)
        if comm is None or comm.size != message.comm_size:
            if message.comm not in state.known:
                state.known.add(message.comm)
                state.met.append((position, message.comm, message.comm_size))
            comm = state.comms[message.comm] = ShardComm(message.comm, message.comm_size)
        ops = message.ops
        ts_ns = message.ts_ns
        comm.ingest(message.rank, ts_ns, ops.seq, ops.op, ops.bytes, ops.enter_ns, ops.end_ns)
        state.touched.add(message.comm)
        state.times.append(ts_ns)
        state.spans.append(
            (
                message.global_rank,
                message.comm,
                ts_ns,
                ops.seq,
                ops.op,
                ops.bytes,
                ops.enter_ns,
                ops.end_ns,
            )
        )
        # The member's latest report of the interval: the job stage's member state after
        # it is what it would be after each of them (the latest time, the latest place).
        key = (message.comm, message.rank)
        before = state.seen.get(key)
        node, gpu, seen_ns = message.node, message.gpu, ts_ns
        if before is not None:
            node = node if node is not None else before[4]
            gpu = gpu if gpu is not None else before[5]
            seen_ns = max(seen_ns, before[6])
        state.seen[key] = (
            message.comm,
            message.comm_size,
            message.rank,
            message.global_rank,
            node,
            gpu,
            seen_ns,
        )
        conns = message.conns
        if conns is not None:
            state.conns.append(
                (
                    message.comm,
                    message.comm_size,
                    message.rank,
                    ts_ns,
                    conns.peer,
                    conns.port,
                    conns.bytes,
                    conns.busy_ns,
                )
            )

    def jobs(self) -> list[str]:
        """The jobs it holds state of."""
        return list(self._jobs)

    def snapshot(self, jobs: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Each of these jobs' state as plain data (JSON types), taken right after a
        barrier: what a restarted node stage goes on from (its groups' operations not
        ended yet, what they handed on, the run). Between barriers what it took waits to be
        handed on, and is no state to keep: a `ValueError`."""
        out: dict[str, dict[str, Any]] = {}
        for job in jobs:
            state = self._jobs.get(job)
            if state is None:
                continue
            if state.times or state.agents or state.met or state.touched:
                message = f"job {job}: a node stage's state is taken right after a barrier"
                raise ValueError(message)
            out[job] = {
                "run": state.run,
                "known": sorted(state.known),
                "comms": [comm.state() for comm in state.comms.values()],
            }
        return out

    def restore(self, job: str, snapshot: dict[str, Any]) -> None:
        """Take a job over from its snapshot (`snapshot`), in place of what it held."""
        state = self._jobs[job] = _NodeJob()
        state.run = int(snapshot["run"])
        state.known = {str(comm) for comm in snapshot["known"]}
        for each in snapshot["comms"]:
            comm = ShardComm.restored(each)
            state.comms[comm.comm] = comm

    def forget(self, job: str) -> None:
        """The job stopped or restarted: what its groups were in is of no run any more."""
        self._jobs.pop(job, None)

    def barrier(self) -> tuple[list[JobShare], int]:
        """Everything taken since the last barrier, per job, and the latest event time of
        it (`NOT_YET`: nothing)."""
        latest, self.latest_ns = self.latest_ns, NOT_YET
        shares = []
        for job, state in self._jobs.items():
            share = _handed_on(job, state)
            if share is not None:
                shares.append(share)
        return shares, latest

    def barrier_of(self, job: str) -> tuple[JobShare | None, int]:
        """One job's barrier (the stages on Kafka meet per job): what was taken of it since
        its last one (None: nothing to hand on), and the latest event time of that."""
        state = self._jobs.get(job)
        if state is None:
            return None, NOT_YET
        latest = state.latest_ns
        return _handed_on(job, state), latest


def _handed_on(job: str, state: _NodeJob) -> JobShare | None:
    """What a job's node stage hands on at a barrier; its interval starts again."""
    state.latest_ns = NOT_YET
    parts: list[SeqPart] = []
    opens: list[SeqPart] = []
    finished: list[tuple[str, int]] = []
    for comm_id, comm in state.comms.items():
        parts.extend(comm.drain())
        if comm.open:
            opens.extend(comm.open_parts())
        if comm_id in state.touched and comm.finished_ns != NOT_YET:
            finished.append((comm_id, comm.finished_ns))
    if not (state.times or parts or opens or state.agents or state.met):
        return None
    share = JobShare(
        job,
        state.run if state.run_said else None,
        tuple(state.times),
        tuple(state.seen.values()),
        tuple(state.conns),
        tuple(parts),
        tuple(opens),
        tuple(finished),
        tuple(state.agents),
        tuple(state.spans),
        tuple(state.met),
    )
    state.met = []
    state.times, state.conns, state.agents, state.spans = [], [], [], []
    state.seen = {}
    state.touched = set()
    state.run_said = False
    return share


def share_row(share: JobShare) -> tuple[Any, ...]:
    """A share as plain data (tuples, numbers, text): what crosses a process boundary."""
    return (
        share.job,
        share.run,
        share.times,
        share.seen,
        share.conns,
        [part_row(part) for part in share.parts],
        [part_row(part) for part in share.opens],
        share.finished,
        share.agents,
        share.spans,
        share.met,
    )


def share_of_row(row: tuple[Any, ...] | list[Any]) -> JobShare:
    """The share a `share_row` holds."""
    job, run, times, seen, conns, parts, opens, finished, agents, spans, met = row
    return JobShare(
        job,
        run,
        times,
        seen,
        conns,
        tuple(part_of_row(each) for each in parts),
        tuple(part_of_row(each) for each in opens),
        finished,
        agents,
        spans,
        met,
    )


def event_time(message: Collective | Collectives) -> int:
    """The event time a report or a batch moves the clock to: its latest ``ts_ns``, the
    batch's own among them (what a router reads off the record without decoding it)."""
    latest = message.ts_ns
    if isinstance(message, Collectives):
        for each in message.messages:
            if each.ts_ns > latest:
                latest = each.ts_ns
    return latest

"""The node stage of one job's detection, and what it hands the job stage.

A job spread over workers (issue 34) is read in two stages. The node stage takes the
collective reports of some nodes' ranks: the per-operation work, one step per rank and
operation, is done there (`streams.core.shard`). At each barrier it hands the job stage,
per job, a `JobShare`: the parts of the operations its members completed, the operations
they are still in, and the reports themselves for what the job stage still reads per
report (liveness, places, connections, compute windows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from schemas.messages import Collective, Collectives
from streams.core.comm import NOT_YET, Report
from streams.core.marks import MarkBlock, RankMarks
from streams.core.shard import SeqPart, ShardComm


class HandedOps(NamedTuple):
    """A report's operations as a node stage hands them on (`schemas.messages.Ops`)."""

    seq: tuple[int, ...]
    op: tuple[str, ...]
    bytes: tuple[int, ...]
    enter_ns: tuple[int, ...]
    end_ns: tuple[int | None, ...]


class HandedConns(NamedTuple):
    """A report's connection samples as a node stage hands them on."""

    peer: tuple[int, ...]
    port: tuple[str, ...]
    bytes: tuple[int, ...]
    busy_ns: tuple[int, ...]


class HandedReport(NamedTuple):
    """A report as a node stage hands it on: what the job stage reads of it (a `Report`),
    validated by the node stage, without the decoded model. Tuples: a process boundary
    carries them at the cost of their values (`handed`)."""

    job: str
    comm: str
    comm_size: int
    rank: int
    global_rank: int
    node: str | None
    gpu: int | None
    ts_ns: int
    ops: HandedOps
    conns: HandedConns | None
    restart: int | None


def handed(report: Report) -> HandedReport:
    """A report as the job stage reads it, in tuples."""
    ops, conns = report.ops, report.conns
    return HandedReport(
        report.job,
        report.comm,
        report.comm_size,
        report.rank,
        report.global_rank,
        report.node,
        report.gpu,
        report.ts_ns,
        HandedOps(ops.seq, ops.op, ops.bytes, ops.enter_ns, ops.end_ns),
        None if conns is None else HandedConns(conns.peer, conns.port, conns.bytes, conns.busy_ns),
        report.restart,
    )


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


def part_of_row(row: tuple[Any, ...]) -> SeqPart:
    """The part a `part_row` holds."""
    comm, size, seq, op, nbytes, first_seen, entered, members, enters, ends, inferred = row
    return SeqPart(
        comm, size, seq, op, nbytes, first_seen, entered, members, enters, ends, inferred
    )


@dataclass(frozen=True, slots=True)
class JobShare:
    """What one node stage hands the job stage of one job at a barrier."""

    job: str
    reports: tuple[Report, ...]
    parts: tuple[SeqPart, ...]  # operations its members completed, in the order they did
    opens: tuple[SeqPart, ...]  # operations its members are still in
    finished: tuple[tuple[str, int], ...]  # (comm, latest end its members reported)
    agents: tuple[tuple[str, int], ...]  # (node, ts) of each batch that named its node
    marks: tuple[MarkBlock, ...] = ()  # its ranks' compute sums (`streams.core.marks`)


@dataclass(slots=True)
class _NodeJob:
    comms: dict[str, ShardComm] = field(default_factory=dict)
    marks: RankMarks = field(default_factory=RankMarks)
    reports: list[Report] = field(default_factory=list)
    agents: list[tuple[str, int]] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # groups with reports since the barrier


class NodeStage:
    """The collective reports of some nodes' ranks, per job and group, until a barrier."""

    def __init__(self) -> None:
        self._jobs: dict[str, _NodeJob] = {}
        # The latest event time of what it took since the last barrier (`event_time`).
        self.latest_ns = NOT_YET

    def on_message(self, message: Collective | Collectives) -> None:
        """Take one report, or one node's batch of them."""
        latest = event_time(message)
        if latest > self.latest_ns:
            self.latest_ns = latest
        if isinstance(message, Collectives):
            for each in message.messages:
                self._take(each)
            if message.node is not None:
                self._job(message.job).agents.append((message.node, message.ts_ns))
        else:
            self._take(message)

    def _job(self, job: str) -> _NodeJob:
        state = self._jobs.get(job)
        if state is None:
            state = self._jobs[job] = _NodeJob()
        return state

    def _take(self, message: Collective) -> None:
        state = self._job(message.job)
        comm = state.comms.get(message.comm)
        if comm is None or comm.size != message.comm_size:
            if comm is not None:
                state.marks.forget(message.comm)
            comm = state.comms[message.comm] = ShardComm(message.comm, message.comm_size)
        state.marks.add(message)
        ops = message.ops
        comm.ingest(
            message.rank, message.ts_ns, ops.seq, ops.op, ops.bytes, ops.enter_ns, ops.end_ns
        )
        state.reports.append(message)
        state.touched.add(message.comm)

    def forget(self, job: str) -> None:
        """The job stopped or restarted: what its groups were in is of no run any more."""
        self._jobs.pop(job, None)

    def barrier(self) -> tuple[list[JobShare], int]:
        """Everything taken since the last barrier, per job, and the latest event time of
        it (`NOT_YET`: nothing)."""
        latest, self.latest_ns = self.latest_ns, NOT_YET
        shares = []
        for job, state in self._jobs.items():
            parts: list[SeqPart] = []
            opens: list[SeqPart] = []
            finished: list[tuple[str, int]] = []
            for comm_id, comm in state.comms.items():
                parts.extend(comm.drain())
                if comm.open:
                    opens.extend(comm.open_parts())
                if comm_id in state.touched and comm.finished_ns != NOT_YET:
                    finished.append((comm_id, comm.finished_ns))
            marks = state.marks.marks()
            if not (state.reports or parts or opens or state.agents or marks):
                continue
            shares.append(
                JobShare(
                    job,
                    tuple(state.reports),
                    tuple(parts),
                    tuple(opens),
                    tuple(finished),
                    tuple(state.agents),
                    tuple(marks),
                )
            )
            state.reports, state.agents = [], []
            state.touched = set()
        return shares, latest


def event_time(message: Collective | Collectives) -> int:
    """The event time a report or a batch moves the clock to: its latest ``ts_ns``, the
    batch's own among them (what a router reads off the record without decoding it)."""
    latest = message.ts_ns
    if isinstance(message, Collectives):
        for each in message.messages:
            if each.ts_ns > latest:
                latest = each.ts_ns
    return latest

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

from schemas.messages import Collective, Collectives
from streams.core.comm import NOT_YET
from streams.core.shard import SeqPart, ShardComm


@dataclass(frozen=True, slots=True)
class JobShare:
    """What one node stage hands the job stage of one job at a barrier."""

    job: str
    reports: tuple[Collective, ...]
    parts: tuple[SeqPart, ...]  # operations its members completed, in the order they did
    opens: tuple[SeqPart, ...]  # operations its members are still in
    finished: tuple[tuple[str, int], ...]  # (comm, latest end its members reported)
    agents: tuple[tuple[str, int], ...]  # (node, ts) of each batch that named its node


@dataclass(slots=True)
class _NodeJob:
    comms: dict[str, ShardComm] = field(default_factory=dict)
    reports: list[Collective] = field(default_factory=list)
    agents: list[tuple[str, int]] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)  # groups with reports since the barrier


class NodeStage:
    """The collective reports of some nodes' ranks, per job and group, until a barrier."""

    def __init__(self) -> None:
        self._jobs: dict[str, _NodeJob] = {}

    def on_message(self, message: Collective | Collectives) -> None:
        """Take one report, or one node's batch of them."""
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
            comm = state.comms[message.comm] = ShardComm(message.comm, message.comm_size)
        ops = message.ops
        comm.ingest(
            message.rank, message.ts_ns, ops.seq, ops.op, ops.bytes, ops.enter_ns, ops.end_ns
        )
        state.reports.append(message)
        state.touched.add(message.comm)

    def forget(self, job: str) -> None:
        """The job stopped or restarted: what its groups were in is of no run any more."""
        self._jobs.pop(job, None)

    def barrier(self) -> list[JobShare]:
        """Everything taken since the last barrier, per job."""
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
            if not (state.reports or parts or opens or state.agents):
                continue
            shares.append(
                JobShare(
                    job,
                    tuple(state.reports),
                    tuple(parts),
                    tuple(opens),
                    tuple(finished),
                    tuple(state.agents),
                )
            )
            state.reports, state.agents = [], []
            state.touched = set()
        return shares

"""Operations recorded in a training process, batched into v1 collective messages.

The recording side runs on the training thread and must cost next to nothing: `CommLog.enter`
appends one small list and bumps the communicator's ``seq``; whoever learns that an
operation finished (a future's callback on the backend's thread) writes its end time into
that list. The batching side (`OpRecorder.messages`) runs off the training thread once per
interval: each communicator's new operations, and those reported in flight earlier that
have finished since, make one message (empty: a heartbeat). Appends and item writes are
atomic under the GIL, so the two sides share no lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from schemas.base import MAX_ITEMS
from schemas.messages import Collective, OpName, Ops

SEQ, OP, BYTES, ENTER, END = range(5)


@dataclass(slots=True)
class CommLog:
    """One communicator as this rank sees it, and its operations not yet reported done."""

    comm: str
    comm_size: int
    rank: int
    global_rank: int
    seq: int = 0
    new: deque[list[object]] = field(default_factory=deque)
    in_flight: list[list[object]] = field(default_factory=list)

    def enter(self, op: OpName, nbytes: int, enter_ns: int) -> list[object]:
        """Record that this rank called an operation; the returned record takes its end."""
        record: list[object] = [self.seq, op, nbytes, enter_ns, None]
        self.seq += 1
        self.new.append(record)
        return record


class OpRecorder:
    """Every communicator of one training process (one global rank)."""

    def __init__(
        self, job: str, node: str | None = None, gpu: int | None = None, restart: int | None = None
    ) -> None:
        self.job, self.node, self.gpu = job, node, gpu
        self.restart = restart  # the job's restart count: which run reports
        self._logs: dict[str, CommLog] = {}

    def comm(self, comm: str, comm_size: int, rank: int, global_rank: int) -> CommLog:
        """The log of a communicator, created on first use."""
        log = self._logs.get(comm)
        if log is None:
            log = CommLog(comm, comm_size, rank, global_rank)
            self._logs[comm] = log
        return log

    def messages(self, ts_ns: int) -> list[Collective]:
        """One message per communicator (more when over the array limit) for this interval."""
        out: list[Collective] = []
        for log in list(self._logs.values()):
            chosen: list[tuple[list[object], int | None]] = []
            still: list[list[object]] = []
            for record in log.in_flight:
                end = record[END]
                if end is None:
                    still.append(record)
                else:
                    chosen.append((record, _as_int(end)))
            while log.new:
                record = log.new.popleft()
                end = record[END]
                chosen.append((record, None if end is None else _as_int(end)))
                if end is None:
                    still.append(record)
            log.in_flight = still
            chosen.sort(key=lambda item: _as_int(item[0][SEQ]))
            for first in range(0, max(len(chosen), 1), MAX_ITEMS):
                out.append(self._message(log, ts_ns, chosen[first : first + MAX_ITEMS]))
        return out

    def _message(
        self, log: CommLog, ts_ns: int, chosen: list[tuple[list[object], int | None]]
    ) -> Collective:
        enters = [_as_int(record[ENTER]) for record, _ in chosen]
        return Collective.of(
            job=self.job,
            comm=log.comm,
            comm_size=log.comm_size,
            rank=log.rank,
            global_rank=log.global_rank,
            node=self.node,
            gpu=self.gpu,
            restart=self.restart,
            ts_ns=max([ts_ns, *enters]),
            ops=Ops(
                seq=tuple(_as_int(record[SEQ]) for record, _ in chosen),
                op=tuple(str(record[OP]) for record, _ in chosen),
                bytes=tuple(_as_int(record[BYTES]) for record, _ in chosen),
                enter_ns=tuple(enters),
                # A wall clock stepped back between enter and end must not make end < enter.
                end_ns=tuple(
                    None if end is None else max(end, enter)
                    for (_, end), enter in zip(chosen, enters, strict=True)
                ),
            ),
        )


def _as_int(value: object) -> int:
    assert isinstance(value, int)  # noqa: S101 -- records hold ints where ints are written
    return value

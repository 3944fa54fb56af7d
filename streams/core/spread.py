"""One job's detection spread over node stages and a job stage, in one process: the
`DetectionStage` the replay runs with ``c4 diagnose --node-stages N``.

Collective reports go to the node stage of their node (`streams.core.split`); everything
else, and what the node stages hand on, to the job stage (the `Engine`). The node stages
hand on at barriers: once a tick of event time (a `TickClock` of their own, moved by the
reports' and the hardware reports' times as read off the input), before a fact about a job
(a placement, a member report, a route plan: it may stop or restart the job) and at the end
of the input. The job stage's clock moves by the reports only at barriers, so a periodic
check judges every report taken before it. What the job stage learns at a barrier is in an
order of its own (`Engine.on_shares`), so the findings are the same however many node
stages took the reports, in one process or in several (`streams.spread_replay`).
"""

from __future__ import annotations

import zlib

from schemas.base import C4Model
from schemas.messages import (
    Collective,
    Collectives,
    Diagnosis,
    Gpu,
    Gpus,
    Job,
    Link,
    Links,
    Member,
    Route,
)
from streams.core.clock import TickClock
from streams.core.comm import NOT_YET
from streams.core.engine import Engine
from streams.core.split import JobShare, NodeStage, event_time


def node_stage_of(node: str, stages: int) -> int:
    """Which of ``stages`` node stages takes a node's reports (stable across runs)."""
    return zlib.crc32(node.encode()) % stages


def hardware_time(message: C4Model) -> int | None:
    """The event time of a hardware report or batch (None for any other message)."""
    if isinstance(message, Links | Gpus):
        return max((each.ts_ns for each in message.messages), default=message.ts_ns)
    if isinstance(message, Link | Gpu):
        return message.ts_ns
    return None


class SpreadDetection:
    """Node stages and a job stage, fed as a replay feeds a stage (`streams.replay`)."""

    def __init__(self, engine: Engine, node_stages: int) -> None:
        if node_stages < 1:
            message = f"node stages must be at least 1, not {node_stages}"
            raise ValueError(message)
        self.engine = engine
        self.stages = [NodeStage() for _ in range(node_stages)]
        # When the stages meet: a tick of the input's event time, before the message
        # whose time makes it due is judged.
        self.meeting = TickClock(engine.params.tick_ns)
        self._position = 0  # messages fed so far: each report's place in the input

    def barrier(self) -> list[Diagnosis]:
        """Hand the job stage what every node stage took since the last barrier; then
        move its clock to the latest of it (a periodic check, when due, judges it all)."""
        shares: list[JobShare] = []
        latest = NOT_YET
        for stage in self.stages:
            taken, until = stage.barrier()
            shares.extend(taken)
            latest = max(latest, until)
        return apply_barrier(self.engine, shares, latest)

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """Feed one message: a report to its node's stage, anything else to the job stage."""
        engine = self.engine
        if isinstance(message, Collective | Collectives):
            node = message.node or message.job
            self._position += 1
            self.stages[node_stage_of(node, len(self.stages))].on_message(message, self._position)
            return self.barrier() if self.meeting.advance(event_time(message)) else []
        hardware_ns = hardware_time(message)
        meets = isinstance(message, Job | Member | Route) or (
            hardware_ns is not None and self.meeting.advance(hardware_ns)
        )
        out = self.barrier() if meets else []
        if isinstance(message, Job) and message.state == "stopped":
            for stage in self.stages:
                stage.forget(message.job)
        if isinstance(message, Member):
            for stage in self.stages:
                stage.on_run(message.job, message.restart)
        out.extend(engine.on_message(message))
        return out

    def on_eof(self) -> list[Diagnosis]:
        """The input ended: the last barrier, then the job stage's last judgement."""
        found = self.barrier()
        return found + self.engine.on_eof()


def apply_barrier(engine: Engine, shares: list[JobShare], latest_ns: int) -> list[Diagnosis]:
    """The job stage's side of a barrier (`Engine.on_barrier`)."""
    return engine.on_barrier(shares, latest_ns)

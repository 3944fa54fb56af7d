"""One job's detection spread over node stages and a job stage, in one process: the
`DetectionStage` the replay runs with ``c4 diagnose --node-stages N``.

Collective reports go to the node stage of their node (`streams.core.split`); everything
else, and what the node stages hand on, to the job stage (the `Engine`). The node stages
hand on at barriers: before each periodic check (when a report's event time makes one due),
before a fact about a job (a placement, a member report, a route plan: it may stop or
restart the job) and at the end of the input. What the job stage learns at a barrier is in
an order of its own (`Engine.on_shares`), so the findings are the same however many node
stages took the reports.
"""

from __future__ import annotations

import zlib

from schemas.base import C4Model
from schemas.messages import Collective, Collectives, Diagnosis, Job, Member, Route
from streams.core.comm import NOT_YET
from streams.core.engine import Engine
from streams.core.split import JobShare, NodeStage, event_time


def node_stage_of(node: str, stages: int) -> int:
    """Which of ``stages`` node stages takes a node's reports (stable across runs)."""
    return zlib.crc32(node.encode()) % stages


class SpreadDetection:
    """Node stages and a job stage, fed as a replay feeds a stage (`streams.replay`)."""

    def __init__(self, engine: Engine, node_stages: int) -> None:
        if node_stages < 1:
            message = f"node stages must be at least 1, not {node_stages}"
            raise ValueError(message)
        self.engine = engine
        self.stages = [NodeStage() for _ in range(node_stages)]

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
            self.stages[node_stage_of(node, len(self.stages))].on_message(message)
            # The clock moves at barriers only: a check judges what every stage took.
            return self.barrier() if engine.clock.due(event_time(message)) else []
        out = self.barrier() if isinstance(message, Job | Member | Route) else []
        if isinstance(message, Job) and message.state == "stopped":
            for stage in self.stages:
                stage.forget(message.job)
        out.extend(engine.on_message(message))
        return out

    def on_eof(self) -> list[Diagnosis]:
        """The input ended: the last barrier, then the job stage's last judgement."""
        found = self.barrier()
        return found + self.engine.on_eof()


def apply_barrier(engine: Engine, shares: list[JobShare], latest_ns: int) -> list[Diagnosis]:
    """The job stage's side of a barrier: what the node stages handed on, then the clock
    moved to the latest event time of it."""
    found = engine.on_shares(shares) if shares else []
    if latest_ns != NOT_YET:
        found.extend(engine.advance(latest_ns))
    return found

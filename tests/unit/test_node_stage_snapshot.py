"""A node stage restored from its snapshot hands the job stage what it would have handed
on had it gone on (`streams.core.split.NodeStage.snapshot`, ``restore``): what a restarted
worker of the split needs from its changelog."""

from __future__ import annotations

import random

import orjson
import pytest

from schemas.base import C4Model
from schemas.messages import Collective, Collectives
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import FAULT_TYPES
from streams.core.split import JobShare, NodeStage
from streams.core.spread import node_stage_of
from tests.unit.suite_cases import suite_case

BARRIER_EVERY = 40  # reports between barriers: several operations each, some left open
STAGES = 2
REDELIVERED_AFTER = 30  # reports
REDELIVERED_SHARE = 0.1


def _reports(kind: str) -> list[Collective | Collectives]:
    scenario = suite_case(kind)
    messages: list[C4Model] = list(simulate_cluster(build_cluster(None, scenario), scenario))
    reports = [m for m in messages if isinstance(m, Collective | Collectives)]
    # Some delivered again a little later, as a consumer restarted from its last commit
    # reads them: an operation handed on before must not open again.
    again = random.Random(7)
    out: list[Collective | Collectives] = []
    for i, report in enumerate(reports):
        out.append(report)
        if i >= REDELIVERED_AFTER and again.random() < REDELIVERED_SHARE:
            out.append(reports[i - REDELIVERED_AFTER])
    return out


def _run(reports: list[Collective | Collectives], restart_at: int | None) -> list[list[JobShare]]:
    """The shares of every barrier; at barrier ``restart_at`` each stage is replaced by one
    restored from its snapshot, as a restarted worker reads it from its changelog."""
    stages = [NodeStage() for _ in range(STAGES)]
    barriers: list[list[JobShare]] = []
    for position, report in enumerate(reports, 1):
        node = report.node or report.job
        stages[node_stage_of(node, STAGES)].on_message(report, position)
        if position % BARRIER_EVERY == 0 or position == len(reports):
            barriers.append([share for stage in stages for share in stage.barrier()[0]])
            if len(barriers) == restart_at:
                stages = [_restarted(stage) for stage in stages]
    return barriers


def _restarted(stage: NodeStage) -> NodeStage:
    kept = orjson.loads(orjson.dumps(stage.snapshot(stage.jobs())))
    fresh = NodeStage()
    for job, state in kept.items():
        fresh.restore(job, state)
    return fresh


@pytest.mark.parametrize("kind", FAULT_TYPES)
def test_a_restored_node_stage_hands_on_what_it_would_have(kind: str) -> None:
    reports = _reports(kind)
    straight = _run(reports, None)
    assert any(share.opens for shares in straight for share in shares)  # some left open
    for restart_at in (1, 3, len(straight) // 2):
        assert _run(reports, restart_at) == straight, restart_at


def test_a_node_stage_state_is_taken_right_after_a_barrier() -> None:
    reports = _reports("slow_gpu")
    stage = NodeStage()
    stage.on_message(reports[0], 1)
    with pytest.raises(ValueError, match="right after a barrier"):
        stage.snapshot(stage.jobs())
    stage.barrier()
    assert set(stage.snapshot(stage.jobs())) == {reports[0].job}

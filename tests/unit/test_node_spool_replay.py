"""Per-node spools replayed after an outage: a job's reports arrive node by node, not in time.

Each node's agent spools what it cannot deliver (`producers.spool`) and replays it, oldest
first, once the broker answers again: in the order it was written, per node. The agents
replay independently, so the job's partition gets one node's backlog, then another's, then
the live reports: out of event-time order across nodes. The first node's replay runs the
job's latest report ahead of the others' by the outage's length; before, the detector took
the others for silent and called them down (a node_down fired and resolved for each), and a
replay more than ``max_lateness`` behind was dropped as late. A member of a communicator
whose other members finish operations took part in them: its node is up, its own reports are
only behind; an operation one member finished is no hang of the others.
"""

from __future__ import annotations

from itertools import permutations

import pytest

from schemas.messages import Collective, Diagnosis
from streams.core.engine import Engine
from streams.live import LiveDetection
from tests.unit.ring_job import T0, RingJob, S

NODES = ("node-000", "node-001", "node-002")
OUTAGE_FROM = T0 + 8 * S


def replayed(messages: list[Collective], outage_s: int, nodes: tuple[str, ...]) -> list[Collective]:
    """The job's reports as its partition holds them after an outage of ``outage_s``: live
    ones until it began, then each node's spool in ``nodes`` order (each in the order it was
    written), then live ones again."""
    ordered = sorted(messages, key=lambda m: m.ts_ns)
    back = OUTAGE_FROM + outage_s * S
    spooled = [
        m for node in nodes for m in ordered if m.node == node and OUTAGE_FROM <= m.ts_ns < back
    ]
    before = [m for m in ordered if m.ts_ns < OUTAGE_FROM]
    return before + spooled + [m for m in ordered if m.ts_ns >= back]


def findings(job: RingJob, timeline: list[Collective]) -> list[Diagnosis]:
    engine = Engine()
    found = [d for m in [job.job_message(), *timeline] for d in engine.process(m)]
    return found + engine.check(engine.now_ns)


def named(found: list[Diagnosis]) -> list[tuple[str, str, str]]:
    return [(d.class_, d.state, d.suspects[0].id if d.suspects else "") for d in found]


@pytest.mark.parametrize("nodes", list(permutations(NODES)), ids="-".join)
def test_spools_replayed_one_node_after_another_are_no_node_down(nodes: tuple[str, ...]) -> None:
    job = RingJob(n=24, ops=150)
    assert named(findings(job, replayed(job.messages(), 10, nodes))) == []


def still_open(found: list[Diagnosis]) -> list[tuple[str, str]]:
    """(class, top suspect) of each finding open at the end."""
    opened: dict[tuple[str, str], bool] = {}
    for cls, state, suspect in named(found):
        opened[(cls, suspect)] = state == "firing"
    return [key for key, firing in opened.items() if firing]


@pytest.mark.parametrize(
    ("job", "truth"),
    [
        (RingJob(n=24, ops=150, dead_node={1: 54}), ("node_down", "node-001")),
        (RingJob(n=24, ops=150, stuck_rank={11: 54}), ("noncomm_hang", "node-001/gpu3")),
    ],
    ids=["node died", "rank stopped"],
)
def test_a_failure_during_the_outage_is_named_whatever_order_the_backlogs_come_in(
    job: RingJob, truth: tuple[str, str]
) -> None:
    # node-001 dies, or one of its processes stops entering operations, 4 s into the outage:
    # found from the replayed backlogs in every order, and nothing else is left open. What
    # remains of the replay order: once the operations stalled, a node whose backlog has not
    # come yet is silent since then like a failed one, and the reports at hand cannot tell
    # them apart; it may be named down until its backlog comes (seconds, live), and that
    # node_down resolves then.
    for nodes in permutations(NODES):
        found = findings(job, replayed(job.messages(), 10, nodes))
        assert still_open(found) == [truth], (nodes, named(found))
        passing = [f for f in named(found) if (f[0], f[2]) != truth]
        assert all(cls == "node_down" for cls, _, _ in passing), (nodes, named(found))


def test_a_replay_longer_than_the_lateness_bound_is_taken_not_dropped() -> None:
    # A 40 s outage: the last node's backlog is up to 40 s older than the first node's
    # replay, more than max_lateness behind the job's latest report, but in order for its
    # node: taken, as it would be live.
    job = RingJob(n=24, ops=400)
    engine = Engine()
    live = LiveDetection(engine, max_lateness_ns=30 * S)
    timeline = replayed(job.messages(), 40, ("node-002", "node-000", "node-001"))
    found = [d for m in [job.job_message(), *timeline] for d in live.on_message(m)]
    found += engine.on_eof()
    assert named(found) == []
    assert live.counters.too_late == 0
    # A report older than the bound behind its own node's latest is still late.
    live.on_message(timeline[-1].model_copy(update={"ts_ns": timeline[-1].ts_ns - 31 * S}))
    assert live.counters.too_late == 1

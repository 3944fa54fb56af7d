"""Detection leaves nothing for the cyclic collector: ``c4 diagnose`` runs without it
(`c4.gc_tuning.no_collections`), so state kept in a reference cycle would never be freed."""

from __future__ import annotations

import gc
import io

import pytest

from schemas.codec import encode
from schemas.files import Topology
from schemas.messages import Job
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import FAULT_TYPES
from streams.core.engine import Engine
from streams.core.spread import SpreadDetection
from streams.replay import Replayed, ReplayStats, replay
from tests.unit.suite_cases import suite_case
from tests.unit.test_earlier_run import requeued

BAD_LINES = [
    b'{"v":1,"kind":"collective"',
    b"not json",
    b'{"v":1,"kind":"collective","job":"x"}',
    b'{"v":1,"kind":"link","node":"n","port":"p","ts_ns":-5}',
    None,  # a line too long to hold
]
END_NS = 1 << 62  # after every report


def _lines(kind: str | None) -> tuple[list[tuple[int, bytes | None]], Topology | None]:
    scenario = suite_case(kind)
    cluster = build_cluster(None, scenario)
    raw: list[bytes | None] = [encode(m) for m in simulate_cluster(cluster, scenario)]
    middle = len(raw) // 2
    raw[middle:middle] = BAD_LINES
    # The jobs stop at the end: what the engine held of them is dropped during the replay.
    for job in scenario.jobs:
        stopped = Job(
            v=1, kind="job", job=job.id, ts_ns=END_NS, state="stopped", ranks=(), comms={}
        )
        raw.append(encode(stopped))
    return list(enumerate(raw, 1)), cluster.topology


def _unreachable_after(stage: Replayed, lines: list[tuple[int, bytes | None]]) -> int:
    """Replay with the collector off; count what only it could have freed of what the
    replay dropped (the stage itself is alive: it is what a replay keeps to the end)."""
    gc.collect()
    gc.disable()
    try:
        stats = ReplayStats()
        for _ in replay(stage, lines, stats, io.StringIO()):
            pass  # what is found is not the point here: what is dropped is
        assert stats.rejected == len(BAD_LINES)
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", [None, *FAULT_TYPES])
def test_a_replay_frees_everything_by_reference_counts(kind: str | None) -> None:
    lines, topology = _lines(kind)
    engine = Engine(topology=topology)
    assert _unreachable_after(engine, lines) == 0
    assert not engine.jobs  # stopped: their detectors were dropped
    spread = SpreadDetection(Engine(topology=topology), 2)
    assert _unreachable_after(spread, lines) == 0


def test_a_requeued_job_frees_its_earlier_run_by_reference_counts() -> None:
    # The stuck ring job requeued at 20 s after its hang fired: member reports of both
    # runs, the old run's last reports among the new one's (the engine ends the old run).
    messages = requeued(tagged=True, member_reports=True)
    raw: list[bytes | None] = [encode(m) for m in messages]
    raw[len(raw) // 2 : len(raw) // 2] = BAD_LINES
    lines = list(enumerate(raw, 1))
    assert _unreachable_after(Engine(), lines) == 0
    assert _unreachable_after(SpreadDetection(Engine(), 2), lines) == 0

"""Interleaved 1F1B (virtual stages): the schedule, its pairs, and detection on it."""

from __future__ import annotations

import pytest

from simulator.cluster import build_cluster
from simulator.interleaved import schedule
from simulator.layout import groups
from simulator.run import simulate_cluster
from simulator.scenario import JobSpec, scenario_from
from streams.core.engine import Engine


@pytest.mark.parametrize(("pp", "microbatches", "v"), [(2, 4, 2), (3, 6, 2), (4, 8, 3), (8, 8, 2)])
def test_every_pass_runs_once_after_what_it_needs(pp: int, microbatches: int, v: int) -> None:
    steps = schedule(pp, microbatches, v)
    assert len({len(stage) for stage in steps}) == 1  # lockstep: one length for all
    ran: dict[tuple[bool, int, int], int] = {}
    for stage, stage_steps in enumerate(steps):
        for t, step in enumerate(stage_steps):
            if step.unit is not None:
                key = (step.unit.backward, step.unit.chunk * pp + stage, step.unit.microbatch)
                assert key not in ran
                ran[key] = t
    last = pp * v - 1
    assert len(ran) == 2 * microbatches * v * pp
    for (backward, virtual, mb), t in ran.items():
        if not backward and virtual > 0:
            assert ran[(False, virtual - 1, mb)] < t
        if backward:
            assert ran[(True, virtual + 1, mb) if virtual < last else (False, virtual, mb)] < t
    for stage in range(pp):  # both ends of a pair agree on every exchange
        nxt = (stage + 1) % pp
        for mine, theirs in zip(steps[stage], steps[nxt], strict=True):
            assert mine.with_next == theirs.with_prev


def test_interleaved_pipelines_have_a_wrap_around_pair() -> None:
    def pairs(pp: int, v: int) -> set[tuple[int, ...]]:
        spec = JobSpec.model_validate(
            {"id": "j", "ranks": 8 * pp, "parallel": {"tp": 8, "pp": pp, "virtual_stages": v}}
        )
        # The pipeline of tensor-parallel index 0: ranks 0, 8, 16, ...
        return {g.members for g in groups(spec) if g.kind == "pp" and g.members[0] % 8 == 0}

    assert pairs(4, 1) == {(0, 8), (8, 16), (16, 24)}
    assert pairs(4, 2) == {(0, 8), (8, 16), (16, 24), (0, 24)}
    assert pairs(2, 2) == {(0, 8)}  # two stages: the one pair carries both directions


def run(faults: list[dict[str, object]]) -> list[tuple[str, str]]:
    scenario = scenario_from(
        {
            "seed": 5,
            "duration_s": 20,
            "jobs": [
                {
                    "id": "job-il",
                    "ranks": 64,
                    "parallel": {"tp": 4, "pp": 4, "microbatches": 8, "virtual_stages": 2},
                }
            ],
            "faults": faults,
        }
    )
    cluster = build_cluster(None, scenario)
    engine = Engine(topology=cluster.topology)
    found = [d for m in simulate_cluster(cluster, scenario) for d in engine.process(m)]
    found += engine.check(engine.now_ns)
    return [(d.class_, d.suspects[0].id) for d in found if d.state == "firing"]


def test_a_healthy_interleaved_job_has_no_finding() -> None:
    assert run([]) == []


@pytest.mark.parametrize(("rank", "gpu"), [(1, "node-000/gpu1"), (60, "node-007/gpu4")])
def test_a_stuck_first_or_last_stage_is_named_not_its_waiting_ring(rank: int, gpu: str) -> None:
    # The wrap-around pair closes the stages into a ring: every other stage ends up waiting.
    fault = {"type": "process_stuck", "job": "job-il", "rank": rank, "at_s": 10}
    assert run([fault]) == [("noncomm_hang", gpu)]

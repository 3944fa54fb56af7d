"""One job's detection spread over node stages finds what one detector finds, whatever the
number of node stages (`streams.core.spread`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from schemas.base import C4Model
from schemas.codec import encode
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import FAULT_TYPES, scenario_from
from streams.core.engine import Engine
from streams.core.spread import SpreadDetection, node_stage_of
from streams.replay import Replayed
from tests.unit.suite_cases import suite_case

ROOT = Path(__file__).resolve().parents[2]


def _findings(stage: Replayed, messages: list[C4Model]) -> list[bytes]:
    found = [d for m in messages for d in stage.on_message(m)]
    return [encode(d) for d in found + stage.on_eof()]


@pytest.mark.parametrize("kind", FAULT_TYPES)
def test_each_fault_kind_is_found_alike_by_one_two_and_four_node_stages(kind: str) -> None:
    scenario = suite_case(kind)
    cluster = build_cluster(None, scenario)
    messages = list(simulate_cluster(cluster, scenario))
    alone = _findings(Engine(topology=cluster.topology), messages)
    assert alone  # the fault is found at all: a comparison of nothing proves nothing
    for stages in (1, 2, 4):
        spread = SpreadDetection(Engine(topology=cluster.topology), stages)
        assert _findings(spread, messages) == alone, stages


def test_a_data_parallel_straggler_is_named_alike_over_node_stages() -> None:
    scenario = scenario_from(
        {
            "name": "spread-dp",
            "seed": 5,
            "duration_s": 12.0,
            "jobs": [{"id": "job-dp", "ranks": 128, "comms": ["dp", "tp"], "compute_ms": 100.0}],
            "faults": [
                {"type": "slow_gpu", "job": "job-dp", "rank": 43, "at_s": 4.0, "factor": 1.3}
            ],
        }
    )
    cluster = build_cluster(None, scenario)
    messages = list(simulate_cluster(cluster, scenario))
    alone = _findings(Engine(topology=cluster.topology), messages)
    assert any(b'"noncomm_slow"' in each for each in alone)
    for stages in (2, 3):
        spread = SpreadDetection(Engine(topology=cluster.topology), stages)
        assert _findings(spread, messages) == alone


def test_a_node_goes_to_the_same_node_stage_every_time() -> None:
    assert node_stage_of("node-007", 4) == node_stage_of("node-007", 4)
    assert {node_stage_of(f"node-{i:03d}", 4) for i in range(64)} == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="at least 1"):
        SpreadDetection(Engine(), 0)


def test_c4_diagnose_with_node_stages_prints_what_it_prints_without(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        '{"name": "cli-spread", "seed": 2, "duration_s": 8.0, "jobs": [{"id": "j", "ranks":'
        ' 32, "comms": ["dp", "tp"], "compute_ms": 50.0}], "faults": [{"type": "slow_gpu",'
        ' "job": "j", "rank": 9, "at_s": 2.0, "factor": 1.4}]}'
    )
    recorded = tmp_path / "job.jsonl"
    command = [sys.executable, "-m", "c4.cli"]
    subprocess.run(  # noqa: S603 -- this interpreter, our own command
        [*command, "simulate", "--scenario", str(scenario), "--out", str(recorded)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    outputs = []
    for extra in ([], ["--node-stages", "1"], ["--node-stages", "3"]):
        done = subprocess.run(  # noqa: S603
            [*command, "diagnose", *extra, str(recorded)],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        outputs.append(done.stdout)
    assert b"noncomm_slow" in outputs[0]
    assert outputs[1] == outputs[0] == outputs[2]
    refused = subprocess.run(  # noqa: S603
        [*command, "diagnose", "--node-stages", "0", str(recorded)],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    assert refused.returncode == 2
    assert b"must be from 1 to 1024, not 0" in refused.stderr

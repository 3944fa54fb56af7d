"""Scenario files: what is accepted, and one-line errors for what is not."""

from __future__ import annotations

from typing import Any

import pytest

from simulator import ScenarioError, SimulatorError, parse_scenario, scenario_from, simulate
from tests.unit.test_simulator import case


def test_the_documented_example_is_accepted() -> None:
    scenario = parse_scenario(
        b'{"seed": 1, "duration_s": 60, "interval_s": 1.0,'
        b' "jobs": [{"id": "job-1", "ranks": 64, "op_bytes": 67108864, "compute_ms": 200,'
        b' "comms": ["dp", "tp"]}],'
        b' "checkpoints": [{"job": "job-1", "at_s": 20, "pause_s": 5}],'
        b' "faults": [{"type": "slow_gpu", "job": "job-1", "rank": 5, "factor": 1.3,'
        b' "at_s": 15}]}'
    )
    assert scenario.jobs[0].comms == ("dp", "tp")
    assert scenario.faults[0].type == "slow_gpu"
    assert scenario.start_ns == 1733130000000000000


def _job(**fields: Any) -> dict[str, Any]:
    return {"duration_s": 10, "jobs": [{"id": "j", "ranks": 16} | fields]}


BAD: list[tuple[dict[str, Any], str]] = [
    ({"jobs": [{"id": "j", "ranks": 8}]}, "duration_s: Field required"),
    (_job(ranks=1), "jobs[0].ranks: Input should be greater than or equal to 2"),
    (_job(comms=["tp"]), "jobs[0]: comms must include 'dp'"),
    (_job(comms=["dp", "pp"]), "jobs[0].comms[1]: Input should be 'dp' or 'tp'"),
    (_job(colour="red"), "jobs[0].colour: Extra inputs are not permitted"),
    (
        {"duration_s": 10, "jobs": [{"id": "j", "ranks": 8}, {"id": "j", "ranks": 8}]},
        "jobs[1].id: 'j' listed twice",
    ),
    (
        _job() | {"faults": [{"type": "slow_gpu", "job": "j", "rank": 16, "factor": 2, "at_s": 1}]},
        "faults[0].rank: 16 >= j's 16 ranks",
    ),
    (
        _job()
        | {"faults": [{"type": "slow_gpu", "job": "j", "rank": 1, "factor": 0.5, "at_s": 1}]},
        "faults[0].factor: Input should be greater than 1",
    ),
    (
        _job() | {"faults": [{"type": "gpu_stop", "job": "x", "rank": 1, "at_s": 1}]},
        "faults[0].job: unknown job 'x'",
    ),
    (
        _job() | {"faults": [{"type": "meteor", "at_s": 1}]},
        "faults[0]: Input tag 'meteor' found using 'type' does not match any of the expected tags",
    ),
    (
        _job()
        | {
            "faults": [
                {"type": "port_degraded", "node": "n", "port": "p", "factor": 1.5, "at_s": 1}
            ]
        },
        "faults[0].factor: Input should be less than 1",
    ),
    (
        _job()
        | {
            "faults": [
                {
                    "type": "port_degraded",
                    "node": "n",
                    "port": "p",
                    "factor": 0.5,
                    "at_s": 5,
                    "until_s": 2,
                }
            ]
        },
        "faults[0]: until_s 2.0 must be after at_s 5.0",
    ),
    (
        _job() | {"checkpoints": [{"job": "j", "at_s": 1, "pause_s": 0}]},
        "checkpoints[0].pause_s: Input should be greater than 0",
    ),
    (_job() | {"interval_s": 0}, "interval_s: Input should be greater than or equal to 0.05"),
]


@pytest.mark.parametrize(("document", "expected"), BAD)
def test_bad_scenarios_give_one_line_errors(document: dict[str, Any], expected: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        scenario_from(document, "s.json")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"s.json: {expected}"), message
    assert isinstance(raised.value, SimulatorError)


TOPOLOGY_MISFITS: list[tuple[dict[str, Any], str]] = [
    (
        _job(nodes=["node-000"]),
        "jobs[0].nodes: 16 ranks need 2 nodes of 8 GPUs, 1 listed",
    ),
    (_job(nodes=["rack-1", "rack-2"]), "scenario names node 'rack-1'"),
    (_job(ranks=12, comms=["dp", "tp"]), "jobs[0].comms: tp needs ranks in multiples of 8"),
    (
        {
            "duration_s": 10,
            "jobs": [
                {"id": "a", "ranks": 8, "nodes": ["node-001"]},
                {"id": "b", "ranks": 8, "nodes": ["node-001"]},
            ],
        },
        "jobs[1].nodes: node 'node-001' is also used by a",
    ),
    (
        _job() | {"faults": [{"type": "link_down", "node": "node-000", "port": "eth0", "at_s": 1}]},
        "faults[0].port: node node-000 has no port 'eth0'",
    ),
    (
        _job()
        | {
            "faults": [
                {
                    "type": "fabric_link_degraded",
                    "link": "leaf-0a~spine-z",
                    "factor": 0.5,
                    "at_s": 1,
                }
            ]
        },
        "faults[0].link: unknown fabric link 'leaf-0a~spine-z'",
    ),
]


@pytest.mark.parametrize(("document", "expected"), TOPOLOGY_MISFITS)
def test_scenarios_that_do_not_fit_the_topology(document: dict[str, Any], expected: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        simulate(None, scenario_from(document))  # raises before the first message
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith(expected), str(raised.value)


def test_listed_nodes_are_used_and_others_fill_in() -> None:
    document = case()
    document["jobs"][1]["nodes"] = ["node-000", "node-001"]
    from simulator.cluster import build_cluster

    cluster = build_cluster(None, scenario_from(document))
    assert cluster.job("job-2").nodes == ("node-000", "node-001")
    assert cluster.job("job-1").nodes == ("node-002", "node-003", "node-004", "node-005")

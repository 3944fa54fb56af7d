from __future__ import annotations

from collections import defaultdict

import pytest

from planner import plan
from planner.eval.baselines import matrix_problem
from planner.eval.matrices import (
    Mix,
    ModelSize,
    TrafficMatrix,
    fail,
    layout_for,
    training_matrix,
)
from tests.unit.planner_cases import make_fabric
from topology import TopologyError
from topology.generate import Shape
from topology.model import Fabric


def small(nodes: int = 32) -> Fabric:
    """Two rails (GPUs) per node, 8 leaves per plane, 4 spines per plane."""
    return make_fabric(Shape(nodes=nodes, spines=4, nics=2, nodes_per_leaf=nodes // 8))


def node(port: str) -> str:
    return port.partition("/")[0]


def nic(port: str) -> str:
    return port.partition("/")[2].partition(":")[0]


def by_phase(matrix: TrafficMatrix) -> dict[str, list[tuple[str, str]]]:
    flows = matrix.flows.flows
    return {
        name: [(flows[f].src, flows[f].dst) for f in members]
        for name, members in matrix.phase_flows().items()
    }


def test_flow_counts_per_phase() -> None:
    fabric = small(16)  # 16 nodes, 2 GPUs (rails) each; one job on all of them
    dp = training_matrix(fabric, "dp", 1, seed=3, channels=2, qps=2)
    # One stage: per rail, 2 channels of a 16-hop ring, 2 queue pairs per hop.
    assert {k: len(v) for k, v in dp.phase_flows().items()} == {"dp": 2 * 2 * 16 * 2}
    three = training_matrix(fabric, "3d", 1, seed=3, channels=2, qps=1)
    assert three.jobs[0].layout.pp == 4 and three.jobs[0].layout.dp == 4
    counts = {k: len(v) for k, v in three.phase_flows().items()}
    # dp: 4 stages x 2 rails x 2 channels x 4 hops; pp: 4 replicas x 2 rails x 3 boundaries.
    assert counts == {"dp": 64, "pp-fwd": 24, "pp-bwd": 24}
    moe = training_matrix(fabric, "moe", 1, seed=3, channels=1, qps=1)
    counts = {k: len(v) for k, v in moe.phase_flows().items()}
    # a2a: 4 stages x 1 group of 4 x 2 rails x 4 x 3 ordered pairs.
    assert counts == {"dp": 32, "pp-fwd": 24, "pp-bwd": 24, "a2a": 96}
    assert len({flow.id for flow in moe.flows.flows}) == len(moe.flows.flows)


@pytest.mark.parametrize("mix", ["dp", "3d", "moe"])
def test_no_flow_inside_a_node_and_every_flow_on_one_rail_of_port_1(mix: Mix) -> None:
    matrix = training_matrix(small(), mix, 2, seed=1)
    assert matrix.flows.flows
    for flow in matrix.flows.flows:
        assert node(flow.src) != node(flow.dst)
        assert nic(flow.src) == nic(flow.dst)
        assert flow.src.endswith(":1") and flow.dst.endswith(":1")


@pytest.mark.parametrize("mix", ["dp", "3d", "moe"])
def test_each_phase_loads_every_port_it_uses_to_its_line_rate(mix: Mix) -> None:
    matrix = training_matrix(small(), mix, 2, seed=2, channels=2, qps=3)
    flows = matrix.flows.flows
    for members in matrix.phase_flows().values():
        out: defaultdict[str, float] = defaultdict(float)
        into: defaultdict[str, float] = defaultdict(float)
        for f in members:
            out[flows[f].src] += flows[f].gbps
            into[flows[f].dst] += flows[f].gbps
        for total in (*out.values(), *into.values()):
            assert total == pytest.approx(200.0)


def test_pipeline_flows_go_both_ways_between_neighbouring_stages() -> None:
    matrix = training_matrix(small(), "3d", 1, seed=4)
    job = matrix.jobs[0]
    stage = {n: k // job.layout.dp for k, n in enumerate(job.nodes)}
    phases = by_phase(matrix)
    forward, backward = phases["pp-fwd"], phases["pp-bwd"]
    for src, dst in forward:
        assert stage[node(dst)] == stage[node(src)] + 1
    for src, dst in backward:
        assert stage[node(dst)] == stage[node(src)] - 1
    assert sorted(forward) == sorted((dst, src) for src, dst in backward)


def test_all_to_all_covers_every_ordered_pair_of_each_expert_group() -> None:
    matrix = training_matrix(small(), "moe", 1, seed=5, channels=1)
    job = matrix.jobs[0]
    shape = job.layout
    assert (shape.pp, shape.dp, shape.ep) == (4, 8, 4)
    pairs = set(by_phase(matrix)["a2a"])
    assert len(pairs) == len(by_phase(matrix)["a2a"])  # no pair twice
    expected = set()
    for stage in range(shape.pp):
        for group in range(shape.dp // shape.ep):
            members = [job.nodes[stage * shape.dp + group * shape.ep + i] for i in range(4)]
            for rail in range(shape.tp):
                ports = [f"{n}/mlx5_{rail}:1" for n in members]
                expected |= {(a, b) for a in ports for b in ports if a != b}
    assert pairs == expected


def test_phase_bytes_follow_the_model() -> None:
    model = ModelSize(params=8e9, hidden=1000, layers=8, seq_len=100, micro_batches=2)
    matrix = training_matrix(small(16), "3d", 1, seed=6, channels=2, qps=2, model=model)
    bytes_of = {phase.name: phase.flow_bytes for phase in matrix.jobs[0].phases}
    # dp: 2 (n-1)/n of this GPU's bf16 gradients (8e9 / (tp 2 x pp 4)), over 2 x 2 flows.
    assert bytes_of["dp"] == pytest.approx(2 * 3 / 4 * 2 * 1e9 / 4)
    # pp: a micro-batch's activations / tp, 2 micro-batches, over 2 queue pairs.
    assert bytes_of["pp-fwd"] == pytest.approx(2 * 100 * 1000 / 2 * 2 / 2)


def test_matrices_are_seeded() -> None:
    fabric = small()
    first = training_matrix(fabric, "moe", 2, seed=7)
    assert training_matrix(fabric, "moe", 2, seed=7) == first
    assert training_matrix(fabric, "moe", 2, seed=8).flows != first.flows


def test_port_failure_fails_over_to_the_port_2_sibling() -> None:
    fabric = small()
    healthy = training_matrix(fabric, "3d", 2, seed=1)
    broken = fail(fabric, healthy, "port", seed=2)
    port = broken.failure.removeprefix("port ")
    assert broken.flows.down == (port,) and not broken.stranded
    before = {flow.id: flow for flow in healthy.flows.flows}
    moved = {flow.id: flow for flow in broken.flows.flows if flow.id in broken.failed_over}
    assert moved and set(moved) == {
        flow.id for flow in healthy.flows.flows if port in (flow.src, flow.dst)
    }
    for flow_id, flow in moved.items():
        old = before[flow_id]
        assert (flow.src, flow.dst) == (
            old.src.replace(":1", ":2"),
            old.dst.replace(":1", ":2"),
        )
    assert all(port not in (flow.src, flow.dst) for flow in broken.flows.flows)
    # The phases still name the same flows, and the planner routes them.
    assert by_phase(broken).keys() == by_phase(healthy).keys()
    assert plan(fabric, broken.flows).max_util > 0


def test_spine_failure_takes_every_link_of_the_spine_down() -> None:
    fabric = small()
    healthy = training_matrix(fabric, "dp", 2, seed=1)
    broken = fail(fabric, healthy, "spine", seed=3)
    spine = broken.failure.removeprefix("spine ")
    number = fabric.spine_index[spine]
    links = {fabric.link_ids[x] for x, s in enumerate(fabric.link_spine) if s == number}
    assert set(broken.flows.down) == links and len(links) == 8  # one per leaf of its plane
    problem = matrix_problem(fabric, broken)
    assert all(number not in spines for spines in problem.cands)
    assert all(path.via != spine for path in plan(fabric, broken.flows).paths)


def test_link_failure_takes_one_fabric_link_down() -> None:
    fabric = small()
    broken = fail(fabric, training_matrix(fabric, "dp", 2, seed=1), "link", seed=4)
    (link,) = broken.flows.down
    assert broken.failure == f"link {link}" and "~" in link
    assert len(broken.flows.flows) == 32 * 2 * 2  # nothing stranded or lost


def test_layouts_refuse_jobs_too_small() -> None:
    assert layout_for("moe", 16, 8).dp == 4
    with pytest.raises(TopologyError):
        layout_for("moe", 12, 8)
    with pytest.raises(TopologyError):
        layout_for("3d", 4, 8)

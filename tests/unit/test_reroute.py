from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from planner.reroute import (
    CurrentPlan,
    RerouteError,
    failed_links,
    job_flows,
    plan_id,
    reroute,
)
from schemas.codec import decode, encode
from schemas.files import Flows
from schemas.messages import Diagnosis, Job, Route
from tests.unit.planner_cases import check_plan
from topology.ecmp import choose_spine, hash_model
from topology.generate import Shape, generate
from topology.model import Fabric

TS = 1_733_130_000_000_000_000


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    # 8 nodes x 2 NICs x 2 ports; 2 nodes per leaf: 4 leaves and 4 spines per plane.
    return Fabric.from_topology(generate(Shape(nodes=8, spines=4, nics=2, nodes_per_leaf=2)))


def make_job(
    name: str,
    nodes: Sequence[str],
    state: str = "running",
    ts_ns: int = TS,
    side: int = 1,
    comms: dict[str, list[int]] | None = None,
) -> Job:
    """Two ranks per node, rank r on GPU r % 2 and port mlx5_<r % 2>:<side>; one ring comm."""
    ranks: list[dict[str, Any]] = [
        {"rank": r, "node": nodes[r // 2], "gpu": r % 2, "port": f"mlx5_{r % 2}:{side}"}
        for r in range(2 * len(nodes))
    ]
    members = comms or {"c0": list(range(len(ranks)))}
    return Job.model_validate(
        {
            "v": 1,
            "kind": "job",
            "job": name,
            "ts_ns": ts_ns,
            "state": state,
            "ranks": ranks,
            "comms": members,
        }
    )


def diagnosis(
    suspects: list[tuple[str, str]],
    cls: str = "link_down",
    state: str = "firing",
    ident: str = "d-1",
) -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": ident,
            "job": None,
            "state": state,
            "class": cls,
            "onset_ns": TS,
            "ts_ns": TS,
            "suspects": [{"type": t, "id": i, "score": 0.9} for t, i in suspects],
        }
    )


JOBS = (
    make_job("job-a", ["node-000", "node-002", "node-004", "node-006"]),
    make_job("job-b", ["node-001", "node-003", "node-005", "node-007"]),
)


def test_ring_hops_between_nodes_are_the_flows(fabric: Fabric) -> None:
    found = job_flows(fabric, JOBS)
    ids = [flow.id for flow in found.flows]
    # The ring goes rail by rail (topology.traffic): 0 2 4 6 (GPU 0 of each node), then
    # 1 3 5 7; every hop crosses two nodes, none is NVLink.
    assert ids[:8] == [
        "job-a/c0/0->2",
        "job-a/c0/2->4",
        "job-a/c0/4->6",
        "job-a/c0/6->1",
        "job-a/c0/1->3",
        "job-a/c0/3->5",
        "job-a/c0/5->7",
        "job-a/c0/7->0",
    ]
    assert len(ids) == 16 and not found.skipped
    first, wrap = found.flows[0], found.flows[3]
    assert (first.src, first.dst, first.gbps) == ("node-000/mlx5_0:1", "node-002/mlx5_0:1", 200.0)
    assert (wrap.src, wrap.dst) == ("node-006/mlx5_0:1", "node-000/mlx5_1:1")


def test_a_restarting_job_is_planned_on_the_nodes_it_comes_back_on(fabric: Fabric) -> None:
    back = make_job("job-r", ["node-001", "node-005"], state="restarting")
    flows = job_flows(fabric, [back]).flows
    assert {flow.src.partition("/")[0] for flow in flows} == {"node-001", "node-005"}
    assert len(flows) == 4
    stopped = make_job("job-r", ["node-001", "node-005"], state="stopped", ts_ns=TS + 1)
    assert job_flows(fabric, [back, stopped]).flows == ()


def test_hops_inside_a_node_are_nvlink(fabric: Fabric) -> None:
    # Two members on node-000, one on node-002: the ring 0 2 1 has its hop 1->0 inside a
    # node (NVLink), and the tensor-parallel pair is all inside one.
    job = make_job("job-n", ["node-000", "node-002"], comms={"c": [0, 1, 2], "tp": [0, 1]})
    ids = [flow.id for flow in job_flows(fabric, [job]).flows]
    assert ids == ["job-n/c/0->2", "job-n/c/2->1"]


def test_flows_leave_out_what_cannot_be_placed(fabric: Fabric) -> None:
    stopped = make_job("job-c", ["node-000", "node-001"], state="stopped")
    older = make_job("job-a", ["node-000", "node-001"], ts_ns=TS - 1)
    portless = Job.model_validate(
        {
            "v": 1,
            "kind": "job",
            "job": "job-d",
            "ts_ns": TS,
            "state": "running",
            "ranks": [
                {"rank": 0, "node": "node-000", "port": "mlx5_0:1"},
                {"rank": 1, "node": "node-002"},
                {"rank": 2, "node": "node-004", "port": "mlx5_9:1"},
                {"rank": 3, "node": "node-006", "port": "mlx5_0:2"},
            ],
            "comms": {"c": [0, 1, 2, 3, 7], "solo": [0]},
        }
    )
    found = job_flows(fabric, [JOBS[0], older, stopped, portless])
    assert {f.id.split("/")[0] for f in found.flows} == {"job-a"}
    assert len(found.flows) == 8  # the newer job-a message wins
    assert found.skipped == (
        "job-d/c/0->1: rank 1 has no port",
        "job-d/c/1->2: rank 1 has no port",
        "job-d/c/2->3: unknown port node-004/mlx5_9:1",
        "job-d/c/3->4: rank 7 has no place",
        "job-d/c/4->0: rank 7 has no place",
    )
    cross = make_job("job-e", ["node-000", "node-002"], comms={"x": [1, 2]})
    mixed = cross.model_copy(
        update={"ranks": (*cross.ranks[:2], cross.ranks[2].model_copy(update={"port": "mlx5_0:2"}))}
    )
    assert job_flows(fabric, [mixed]).skipped == (
        "job-e/x/0->1: node-000/mlx5_1:1 and node-002/mlx5_0:2 are in different planes",
        "job-e/x/1->0: node-002/mlx5_0:2 and node-000/mlx5_1:1 are in different planes",
    )


def test_failed_links_from_suspects(fabric: Fabric) -> None:
    port = "node-001/mlx5_0:1"
    assert failed_links(fabric, diagnosis([("port", port), ("gpu", "node-001/gpu0")])) == (port,)
    link = "leaf-0a~spine-a-1"
    assert failed_links(fabric, diagnosis([("link", link)], "link_degraded")) == (link,)
    spine = failed_links(fabric, diagnosis([("switch", "spine-a-2")]))
    assert spine == (
        "leaf-0a~spine-a-2",
        "leaf-1a~spine-a-2",
        "leaf-2a~spine-a-2",
        "leaf-3a~spine-a-2",
    )
    leaf = failed_links(fabric, diagnosis([("switch", "leaf-1b")]))
    assert "node-002/mlx5_0:2" in leaf and "leaf-1b~spine-b-0" in leaf and len(leaf) == 4 + 4
    with pytest.raises(RerouteError, match="is gpu_fault, not a link finding"):
        failed_links(fabric, diagnosis([("port", port)], "gpu_fault"))
    with pytest.raises(RerouteError, match=r"names no link of the topology \(link nope\)"):
        failed_links(fabric, diagnosis([("link", "nope")]))
    with pytest.raises(RerouteError, match="names no link"):
        failed_links(fabric, diagnosis([("port", port)]), min_score=0.95)


def test_first_reroute_plans_every_flow_and_tells_every_sending_node(fabric: Fabric) -> None:
    link = "leaf-0a~spine-a-0"
    result = reroute(fabric, JOBS, None, diagnosis([("link", link)]), TS)
    flows = job_flows(fabric, JOBS)
    assert result.strategy == "full" and result.before_max_util is None
    assert set(result.moved) == set(result.changed) == {f.id for f in flows.flows}
    assert result.current.down == (link,) and result.current.diagnosis == "d-1"
    assert result.after_max_util == result.current.plan.max_util == pytest.approx(result.bound)
    senders = sorted({f.src.split("/")[0] for f in flows.flows})
    assert [route.node for route in result.routes] == senders
    for route in result.routes:
        assert route.plan == result.current.id and route.ts_ns == TS
        assert decode(encode(route), "route") == route  # a valid v1 route message
    paths = {p.flow: p for p in result.current.plan.paths}
    for route in result.routes:
        for hop in route.paths:
            assert hop.via == paths[hop.flow].via
            assert f"{route.node}/{hop.port}" == paths[hop.flow].links[0]
            assert hop.sport is None  # no hash model given


def plan_in_force(fabric: Fabric) -> CurrentPlan:
    first = reroute(fabric, JOBS, None, diagnosis([("link", "leaf-3b~spine-b-3")]), TS)
    return first.current


def test_link_down_moves_only_its_flows_and_tells_only_their_nodes(fabric: Fabric) -> None:
    current = plan_in_force(fabric)
    used = {p.links[1] for p in current.plan.paths if p.via}
    link = sorted(used)[0]
    crossing = {p.flow for p in current.plan.paths if link in p.links}
    finding = diagnosis([("link", link)], ident="d-2")
    result = reroute(fabric, JOBS, current, finding, TS + 5)
    flows = job_flows(fabric, JOBS).flows
    check_plan(
        fabric,
        Flows(v=1, kind="flows", flows=flows, down=()),
        result.current.plan,
        [link, *current.down],
    )
    assert set(result.moved) == set(result.changed) == crossing
    assert result.current.down == tuple(sorted({link, *current.down}))
    assert result.before_max_util == current.plan.max_util
    nodes = {f.src.split("/")[0] for f in flows if f.id in crossing}
    assert {route.node for route in result.routes} == nodes
    for route in result.routes:  # all of the node's paths, not only the moved ones
        assert {hop.flow for hop in route.paths} == {
            f.id for f in flows if f.src.startswith(route.node + "/")
        }
    again = reroute(fabric, JOBS, current, finding, TS + 9)
    assert (
        again.current.id
        == result.current.id
        == plan_id(current.id, "d-2", "firing", result.current.down)
    )
    assert again.routes[0].paths == result.routes[0].paths


def test_resolved_gives_the_link_back_and_moves_nothing(fabric: Fabric) -> None:
    current = plan_in_force(fabric)
    result = reroute(
        fabric, JOBS, current, diagnosis([("link", "leaf-3b~spine-b-3")], state="resolved"), TS
    )
    assert result.current.down == ()
    assert result.moved == result.changed == ()
    assert result.routes == ()
    assert result.current.plan.paths == current.plan.paths


def test_a_down_cable_fails_over_to_the_sibling_ports(fabric: Fabric) -> None:
    current = plan_in_force(fabric)
    cable = "node-002/mlx5_0:1"  # job-a rank 2's port: hop 0->2 ends there, 2->4 leaves it
    result = reroute(fabric, JOBS, current, diagnosis([("port", cable)]), TS)
    assert result.failed_over == ("job-a/c0/0->2", "job-a/c0/2->4")
    assert result.stranded == ()
    path = next(p for p in result.current.plan.paths if p.flow == "job-a/c0/0->2")
    assert path.links[0] == "node-000/mlx5_0:2" and path.links[-1] == "node-002/mlx5_0:2"
    assert path.via is not None and path.via.startswith("spine-b-")
    route = next(r for r in result.routes if r.node == "node-000")
    hop = next(h for h in route.paths if h.flow == "job-a/c0/0->2")
    assert (hop.port, hop.via) == ("mlx5_0:2", path.via)
    # With the sibling's cable down as well the flows have nowhere to go.
    both = CurrentPlan(current.id, current.plan, ("node-002/mlx5_0:2",), TS)
    stranded = reroute(fabric, JOBS, both, diagnosis([("port", cable)]), TS)
    assert stranded.stranded == (
        "job-a/c0/0->2: the cable of node-002/mlx5_0:1 is down, no sibling port",
        "job-a/c0/2->4: the cable of node-002/mlx5_0:1 is down, no sibling port",
    )
    assert "job-a/c0/0->2" not in {p.flow for p in stranded.current.plan.paths}


def test_a_hash_model_puts_the_steering_source_port_in_the_route(fabric: Fabric) -> None:
    model = hash_model("crc32")
    link = "leaf-0a~spine-a-1"
    result = reroute(fabric, JOBS, None, diagnosis([("link", link)]), TS, hash_model=model)
    flows = {f.id: f for f in job_flows(fabric, JOBS).flows}
    for route in result.routes:
        for hop in route.paths:
            flow = flows[hop.flow]
            assert hop.sport is not None
            assert choose_spine(fabric, model, flow.src, flow.dst, hop.sport, [link]) == hop.via


def test_route_messages_are_keyed_by_node_in_the_route_topic(fabric: Fabric) -> None:
    result = reroute(fabric, JOBS, None, diagnosis([("link", "leaf-0a~spine-a-0")]), TS)
    assert all(isinstance(route, Route) for route in result.routes)
    assert len({route.node for route in result.routes}) == len(result.routes)


def test_a_flow_failed_over_into_one_leaf_is_planned_there_not_a_crash() -> None:
    # The smallest fabric that shows it: one plane, two leaves, one spine, two nodes with one
    # NIC whose port 1 is on leaf-0a and port 2 on leaf-1a. The ring 0 -> 1 -> 0 crosses the
    # spine; with node-000's port 1 down both hops fail over to port 2 on both nodes, within
    # leaf-1a: they have no spine to choose, and must not be placed on one (spine -1).
    small = Fabric.from_topology(
        generate(Shape(nodes=2, spines=1, nics=1, planes=1, nodes_per_leaf=2))
    )
    ring = Job.model_validate(
        {
            "v": 1,
            "kind": "job",
            "job": "job-s",
            "ts_ns": TS,
            "state": "running",
            "ranks": [
                {"rank": 0, "node": "node-000", "port": "mlx5_0:1"},
                {"rank": 1, "node": "node-001", "port": "mlx5_0:2"},
            ],
            "comms": {"c": [0, 1]},
        }
    )
    unused = diagnosis([("port", "node-001/mlx5_0:1")])  # a cable no hop uses
    first = reroute(small, [ring], None, unused, TS)
    assert {p.via for p in first.current.plan.paths} == {"spine-a-0"}
    cable = "node-000/mlx5_0:1"
    second = reroute(small, [ring], first.current, diagnosis([("port", cable)], ident="d-2"), TS)
    assert second.failed_over == ("job-s/c/0->1", "job-s/c/1->0")
    assert second.stranded == ()
    paths = {p.flow: (p.via, p.links) for p in second.current.plan.paths}
    assert paths == {
        "job-s/c/0->1": (None, ("node-000/mlx5_0:2", "node-001/mlx5_0:2")),
        "job-s/c/1->0": (None, ("node-001/mlx5_0:2", "node-000/mlx5_0:2")),
    }
    assert set(second.changed) == set(paths)
    # A whole leaf down (its uplink and cables) on top: the same, from the plan in force.
    leaf = diagnosis([("switch", "leaf-0a")], ident="d-3")
    third = reroute(small, [ring], first.current, leaf, TS)
    assert third.stranded == () and len(third.current.plan.paths) == 2


def test_the_reroute_says_each_phase_s_bound_and_what_it_misses_of_it(fabric: Fabric) -> None:
    current = plan_in_force(fabric)
    # Every spine of leaf-0a's plane but one down: its ring hops share one uplink, and the
    # data-parallel phase (one ring per job) is still at its bound, now 2.
    spines = [f"leaf-0a~spine-a-{s}" for s in range(1, 4)]
    result = reroute(fabric, JOBS, current, diagnosis([("link", s) for s in spines]), TS + 5)
    assert result.phase_bounds == {"dp": pytest.approx(2.0)} and result.bound == 2.0
    assert (result.current.plan.phases or {})["dp"] == result.after_max_util == result.bound
    assert result.misses == {} and result.extra_moves == 0

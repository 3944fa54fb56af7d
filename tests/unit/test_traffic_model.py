"""One model of where traffic goes (`topology.traffic`), and planner and simulator sharing it."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from planner import plan
from planner.reroute import job_flows
from schemas.files import Flows
from simulator.cluster import build_cluster
from simulator.run import job_message
from simulator.scenario import scenario_from
from topology.model import Fabric
from topology.traffic import network_hops, ring_hops, ring_order

T0 = 1_700_000_000_000_000_000


@given(st.lists(st.integers(0, 5), min_size=0, max_size=40))
def test_every_member_sends_once_and_receives_once(nodes: list[int]) -> None:
    hops = ring_hops(nodes)
    if len(nodes) < 2:
        assert hops == ()
        return
    assert sorted(a for a, _ in hops) == list(range(len(nodes)))
    assert sorted(b for _, b in hops) == list(range(len(nodes)))
    assert sorted(ring_order(nodes)) == list(range(len(nodes)))
    # A ring, not several: following the hops from 0 visits every member.
    after = dict(hops)
    seen, at = [0], after[0]
    while at != 0:
        seen.append(at)
        at = after[at]
    assert len(seen) == len(nodes)


@given(st.integers(2, 16), st.integers(1, 8))
def test_members_alike_on_every_node_cross_on_their_rail(count: int, per_node: int) -> None:
    nodes = [rank // per_node for rank in range(count * per_node)]
    crossing = network_hops(nodes)
    assert len(crossing) == len(nodes)  # no hop stays inside a node
    # Same position on both nodes except where a row of the ring wraps to the next rail.
    same_rail = sum(a % per_node == b % per_node for a, b in crossing)
    assert same_rail == len(nodes) - per_node + (per_node == 1) * per_node


def test_a_communicator_inside_one_node_has_no_network_traffic() -> None:
    assert network_hops(["n"] * 8) == ()
    assert ring_hops(["n"]) == ()
    assert ring_hops(["a", "b"]) == ((0, 1), (1, 0))  # a pair: both directions


def test_planner_and_simulator_put_the_same_flows_on_the_same_ports() -> None:
    scenario = scenario_from(
        {
            "name": "one-model",
            "seed": 3,
            "duration_s": 10,
            "fabric": {"nodes_per_leaf": 2, "spines": 2},
            "jobs": [
                {"id": "plain", "ranks": 24, "comms": ["dp", "tp"]},
                {"id": "small", "ranks": 8},
                {
                    "id": "three-d",
                    "ranks": 32,
                    "parallel": {"tp": 2, "pp": 2, "ep": 2, "microbatches": 4},
                },
            ],
        }
    )
    cluster = build_cluster(None, scenario)
    simulated = {
        f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}": (conn.src_port, conn.dst_port)
        for job in cluster.jobs
        for comm in job.comms
        for conn in comm.network()
    }
    fabric = Fabric.from_topology(cluster.topology)
    planned = job_flows(fabric, [job_message(job, T0) for job in cluster.jobs])
    assert not planned.skipped
    assert {flow.id: (flow.src, flow.dst) for flow in planned.flows} == simulated
    per_job = Counter(flow.id.split("/")[0] for flow in planned.flows)
    assert "small" not in per_job  # one node: everything on NVLink
    assert per_job["plain"] > 0 and per_job["three-d"] > 0
    # Every NIC port of the plain job's three nodes sends: the ring goes rail by rail.
    senders = {flow.src for flow in planned.flows if flow.id.startswith("plain/")}
    assert len(senders) == 24


def test_the_simulator_runs_a_plan_s_routes_and_its_collisions_go() -> None:
    scenario = scenario_from(
        {
            "name": "planned",
            "seed": 5,
            "duration_s": 10,
            "fabric": {"nodes_per_leaf": 2, "spines": 8},  # 1:1: 16 ports, 8 uplinks of 400G
            "jobs": [
                {"id": "a", "ranks": 32, "nodes": ["node-000", "node-002", "node-004", "node-006"]},
                {"id": "b", "ranks": 32, "nodes": ["node-001", "node-003", "node-005", "node-007"]},
            ],
        }
    )
    on_ecmp = build_cluster(None, scenario)
    fabric = Fabric.from_topology(on_ecmp.topology)
    flows = job_flows(fabric, [job_message(job, T0) for job in on_ecmp.jobs]).flows
    result = plan(fabric, Flows(v=1, kind="flows", flows=flows))
    assert result.max_util == 1.0
    spines = {path.flow: path.via for path in result.paths if path.via is not None}
    on_plan = build_cluster(on_ecmp.topology, scenario, spines)
    conns = {
        f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}": conn
        for job in on_plan.jobs
        for comm in job.comms
        for conn in comm.network()
    }
    assert {flow: conn.via for flow, conn in conns.items() if conn.via} == spines
    assert {conn.gbps for conn in conns.values()} == {200.0}  # no two on one link
    # The leaves' hash puts some on one link: they share it.
    collided = [c for job in on_ecmp.jobs for comm in job.comms for c in comm.network()]
    assert min(conn.gbps for conn in collided) < 200.0

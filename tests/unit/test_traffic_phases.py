"""Traffic by phase (`topology.traffic`): communicators' kinds, the all-to-all as all pairs,
and the planner planning each phase apart (`planner.phases`)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner import lower_bound, plan, replan, replan_choice
from planner.reroute import job_flows, link_utilization
from schemas.files import Flows
from simulator.cluster import PlacedJob, build_cluster
from simulator.run import job_message
from simulator.scenario import scenario_from
from topology.generate import Shape, generate
from topology.model import Fabric
from topology.traffic import all_pairs, comm_kinds, kind_hops, network_hops, shared_gbps

T0 = 1_700_000_000_000_000_000


@given(st.lists(st.integers(0, 6), min_size=0, max_size=24))
def test_all_pairs_is_every_ordered_pair_across_nodes_once(nodes: list[int]) -> None:
    pairs = all_pairs(nodes)
    assert len(pairs) == len(set(pairs))
    expected = {
        (a, b) for a in range(len(nodes)) for b in range(len(nodes)) if nodes[a] != nodes[b]
    }
    assert set(pairs) == expected


def test_an_expert_group_on_n_nodes_has_n_times_n_minus_1_flows_each_a_share() -> None:
    nodes = ["a", "b", "c", "d"]
    hops = kind_hops("ep", nodes)
    assert len(hops) == 4 * 3
    assert shared_gbps(hops, [200.0] * 12, [200.0] * 12) == pytest.approx([200.0 / 3] * 12)
    ring = kind_hops("dp", nodes)
    assert ring == network_hops(nodes)
    assert shared_gbps(ring, [200.0] * 4, [200.0] * 4) == [200.0] * 4  # a ring hop: line rate
    # A middle pipeline stage sends to both neighbours from one port: half each.
    assert shared_gbps([(1, 0), (1, 2), (0, 1)], [200.0] * 3, [200.0] * 3) == [100.0, 100.0, 200.0]


def test_kinds_from_ids_and_members() -> None:
    comms = {
        "w": list(range(16)),  # every rank: the default process group
        "d0": [0, 2, 4, 6],
        "d1": [1, 3, 5, 7],
        "e0": [0, 2],  # inside d0: an expert group
        "e1": [4, 6],
        "pipe:p2p:0-8": [0, 8],
        "t0": [0, 1],  # inside nothing larger: a ring of its own
    }
    kinds = comm_kinds(comms, 16)
    assert kinds == {
        "w": "world",
        "d0": "dp",
        "d1": "dp",
        "e0": "ep",
        "e1": "ep",
        "pipe:p2p:0-8": "pp",
        "t0": "dp",
    }
    assert comm_kinds({"only": [0, 1, 2]}) == {"only": "dp"}  # a plain job's one ring
    # A plain job's ring over every rank holds its tensor-parallel groups, inside nodes: with
    # the ranks' nodes it stays a data-parallel ring, and they count for nothing.
    plain = {"ring": [0, 1, 2, 3], "tp0": [0, 1], "tp1": [2, 3]}
    node_of = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert comm_kinds(plain, 4, node_of)["ring"] == "dp"
    assert comm_kinds(plain, 4)["ring"] == "world"  # without places every group counts


def moe_cluster(ep: int) -> tuple[Fabric, list[PlacedJob]]:
    scenario = scenario_from(
        {
            "name": "moe",
            "seed": 1,
            "duration_s": 5,
            "fabric": {"nodes_per_leaf": 2, "spines": 8},
            "jobs": [
                {
                    "id": "moe",
                    "ranks": 8 * 2 * 8,
                    "parallel": {"tp": 8, "pp": 2, "ep": ep, "microbatches": 4},
                }
            ],
        }
    )
    cluster = build_cluster(None, scenario)
    return Fabric.from_topology(cluster.topology), list(cluster.jobs)


def test_the_simulator_s_communicators_get_their_kinds() -> None:
    _, jobs = moe_cluster(4)
    job = jobs[0]
    kinds = comm_kinds({comm.id: comm.members for comm in job.comms}, job.spec.ranks)
    for comm in job.comms:
        if comm.network():
            assert kinds[comm.id] == comm.kind, comm.name


def test_reroute_flows_carry_phases_and_all_pairs() -> None:
    fabric, jobs = moe_cluster(4)
    flows = job_flows(fabric, [job_message(job, T0) for job in jobs]).flows
    phases = Counter(flow.phase for flow in flows)
    # 2 stages x 8 rails x 8 replicas: dp rings of 8 hops, ep groups of 4 as all pairs, one
    # pipeline pair per (replica, rail) with its two directions.
    assert phases == {"dp": 2 * 8 * 8, "ep": 2 * 8 * 2 * 4 * 3, "pp": 8 * 8 * 2}
    ep = [flow for flow in flows if flow.phase == "ep"]
    assert [flow.gbps for flow in ep] == pytest.approx([200.0 / 3] * len(ep))
    # With two stages each port sends one pipeline flow and one ring hop: each at line rate.
    assert {flow.gbps for flow in flows if flow.phase in ("pp", "dp")} == {200.0}


def test_phases_are_planned_apart_at_each_phase_s_bound() -> None:
    fabric, jobs = moe_cluster(4)
    flows = Flows(
        v=1, kind="flows", flows=job_flows(fabric, [job_message(j, T0) for j in jobs]).flows
    )
    phased = plan(fabric, flows)
    bound = lower_bound(fabric, flows)
    assert phased.max_util == pytest.approx(bound)
    assert phased.phases is not None and set(phased.phases) == {"dp", "ep", "pp"}
    assert phased.max_util == max(phased.phases.values())
    assert [path.flow for path in phased.paths] == [flow.id for flow in flows.flows]
    # The same flows, phases unknown, all compete: their sum is what the plan then balances.
    together = Flows(
        v=1, kind="flows", flows=tuple(f.model_copy(update={"phase": None}) for f in flows.flows)
    )
    joint = plan(fabric, together)
    assert joint.phases is None
    assert joint.max_util > phased.max_util


def test_flows_of_two_phases_on_one_port_do_not_compete() -> None:
    fabric = Fabric.from_topology(generate(Shape(nodes=4, spines=2, nics=1, nodes_per_leaf=1)))
    row = {"src": "node-000/mlx5_0:1", "dst": "node-001/mlx5_0:1", "gbps": 200}
    apart = Flows.model_validate(
        {
            "v": 1,
            "kind": "flows",
            "flows": [{"id": "a", **row, "phase": "dp"}, {"id": "b", **row, "phase": "pp"}],
        }
    )
    together = Flows.model_validate(
        {"v": 1, "kind": "flows", "flows": [{"id": "a", **row}, {"id": "b", **row}]}
    )
    assert plan(fabric, apart).max_util == pytest.approx(1.0)
    assert plan(fabric, together).max_util == pytest.approx(2.0)  # one cable, both flows
    assert plan(fabric, apart).phases == {"dp": pytest.approx(1.0), "pp": pytest.approx(1.0)}


def test_a_replan_after_a_failure_moves_only_affected_flows_phase_by_phase() -> None:
    fabric, jobs = moe_cluster(4)
    flows = Flows(
        v=1, kind="flows", flows=job_flows(fabric, [job_message(j, T0) for j in jobs]).flows
    )
    before = plan(fabric, flows)
    busy = Counter(link for path in before.paths if path.via for link in path.links[1:3])
    link = busy.most_common(1)[0][0]
    after = replan(fabric, before, flows, [link])
    crossed = {path.flow for path in before.paths if link in path.links}
    moved = {
        new.flow
        for old, new in zip(before.paths, after.paths, strict=True)
        if old.links != new.links
    }
    assert moved == crossed
    assert all(link not in path.links for path in after.paths)
    assert after.phases is not None
    best = replan_choice(fabric, before, flows, [link], mode="best")
    assert best.plan.max_util <= after.max_util + 1e-9
    assert best.bound == pytest.approx(lower_bound(fabric, flows, [link]))
    assert set(best.forced) <= set(best.moved)


def test_link_utilisation_is_taken_in_the_busiest_phase() -> None:
    fabric = Fabric.from_topology(generate(Shape(nodes=4, spines=2, nics=1, nodes_per_leaf=1)))
    row = {"src": "node-000/mlx5_0:1", "dst": "node-001/mlx5_0:1", "gbps": 200}
    flows = Flows.model_validate(
        {
            "v": 1,
            "kind": "flows",
            "flows": [{"id": "a", **row, "phase": "dp"}, {"id": "b", **row, "phase": "pp"}],
        }
    )
    result = plan(fabric, flows)
    demand = {"a": 200.0, "b": 200.0}
    apart = link_utilization(fabric, result, demand, {"a": "dp", "b": "pp"})
    together = link_utilization(fabric, result, demand)
    assert apart["node-000/mlx5_0:1"] == pytest.approx(1.0)
    assert together["node-000/mlx5_0:1"] == pytest.approx(2.0)


def test_the_simulator_runs_an_expert_group_s_all_to_all_as_the_planner_s_pairs() -> None:
    fabric, jobs = moe_cluster(4)
    job = jobs[0]
    flows = job_flows(fabric, [job_message(job, T0)]).flows
    planned = {flow.id: flow.gbps for flow in flows if flow.phase == "ep"}
    pairs = {
        f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}": conn
        for comm in job.comms
        if comm.kind == "ep"
        for conn in comm.pairs or ()
    }
    assert set(pairs) == set(planned)  # n (n-1) per group, the planner's ids
    # Each pair asks for its share of its ports, as the planner's demand says (a fabric
    # link's fair share is more: 8 spines for the few pairs between two leaves).
    assert [pairs[flow].gbps for flow in planned] == pytest.approx(list(planned.values()))
    for comm in job.comms:
        if comm.kind == "ep":
            assert comm.pairs is not None
            by_ends = {(conn.src, conn.dst): conn for conn in comm.pairs}
            for conn in comm.network():  # a ring hop is the pair of the same two members
                assert (conn.via, conn.links, conn.sport) == (
                    by_ends[(conn.src, conn.dst)].via,
                    by_ends[(conn.src, conn.dst)].links,
                    by_ends[(conn.src, conn.dst)].sport,
                )
        else:
            assert comm.pairs is None


def test_an_expert_group_of_two_is_its_ring() -> None:
    _, jobs = moe_cluster(2)
    assert all(comm.pairs is None for comm in jobs[0].comms)


def test_a_plan_routes_every_pair_of_the_all_to_all() -> None:
    fabric, jobs = moe_cluster(4)
    flows = Flows(
        v=1, kind="flows", flows=job_flows(fabric, [job_message(j, T0) for j in jobs]).flows
    )
    spines = {path.flow: path.via for path in plan(fabric, flows).paths if path.via}
    scenario = scenario_from(
        {
            "name": "moe",
            "seed": 1,
            "duration_s": 5,
            "fabric": {"nodes_per_leaf": 2, "spines": 8},
            "jobs": [
                {
                    "id": "moe",
                    "ranks": 8 * 2 * 8,
                    "parallel": {"tp": 8, "pp": 2, "ep": 4, "microbatches": 4},
                }
            ],
        }
    )
    routed = build_cluster(None, scenario, {k: v for k, v in spines.items() if v is not None})
    job = routed.jobs[0]
    crossing = [
        (f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}", conn.via)
        for comm in job.comms
        for conn in comm.pairs or ()
        if conn.links
    ]
    assert crossing and all(spines[flow] == via for flow, via in crossing)

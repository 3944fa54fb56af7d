"""The reroute action in the worker against real Kafka and real Redis."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer

from actions.drivers.reroute.plan_store import PlanStore
from actions.state import StateError
from schemas.codec import decode
from schemas.messages import Action, Job, Route
from tests.integration.actions_harness import (
    Cluster,
    HttpReceiver,
    config,
    diagnosis,
    job_message,
    wait_for,
    worker,
)
from tests.integration.workers import REPO
from topology.generate import Shape, generate

pytestmark = pytest.mark.integration

# Leaves alternate around the ring (two ranks a node, both on mlx5_0:1, the ring rank by rank
# position: topology.traffic): every hop crosses the fabric, six leave leaf-0a over its two
# plane-a uplinks (and six come back), two leave every node's port.
RING = ["node-000", "node-008", "node-001", "node-009", "node-002", "node-010"]
UNUSED = "leaf-0b~spine-b-0"  # plane b: the job's ports (mlx5_0:1) are all on plane a
USED = "leaf-0a~spine-a-0"
OTHER = "leaf-0a~spine-a-1"  # leaf-0a's other plane-a uplink


class Routes:
    """The route topic with its keys, read incrementally."""

    def __init__(self, cluster: Cluster) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": f"routes-{cluster.unique}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self._consumer.subscribe([cluster.topic("route")])
        self.seen: list[tuple[str, Route]] = []

    def read(self) -> list[tuple[str, Route]]:
        while (record := self._consumer.poll(0.3)) is not None:
            if record.error() is None:
                route = decode(record.value() or b"", "route")
                assert isinstance(route, Route), route
                self.seen.append(((record.key() or b"").decode(), route))
        return list(self.seen)

    def close(self) -> None:
        self._consumer.close()


def reroutes(actions: list[Action], ident: str, state: str = "firing") -> list[Action]:
    return [
        a
        for a in actions
        if a.action == "reroute" and a.diagnosis == ident and a.detail["state"] == state
    ]


def test_link_down_reroutes_once_publishes_routes_per_node_and_gives_the_link_back(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    plans = PlanStore(cluster.state.client, f"{cluster.key_prefix}:plan:")
    routes = Routes(cluster)
    first = diagnosis("d-0", None, [("link", UNUSED, 0.9)], cls="link_down")
    down = diagnosis("d-1", None, [("link", USED, 0.95)], cls="link_down")
    back = {**down, "state": "resolved", "ts_ns": down["ts_ns"] + 10**9}
    later = diagnosis("d-2", None, [("link", OTHER, 0.95)], cls="link_down")
    try:
        with worker(cluster, config(receiver)):
            cluster.job("job-r", RING)
            # The first reroute finds no plan in force (the fabric ran ECMP): it plans every
            # flow and tells every sending node.
            cluster.send("diagnosis", first, key="fabric")
            initial = reroutes(cluster.wait_actions(2), "d-0")
            cluster.send("diagnosis", down, key="fabric")
            cluster.send("diagnosis", down, key="fabric")  # delivered twice: one reroute
            cluster.send("diagnosis", back, key="fabric")
            actions = cluster.wait_actions(6)
            wait_for(lambda: len(routes.read()) >= 6, what="the first plan's routes")
            current = plans.current()
            # With the link back, losing leaf-0a's other uplink moves every flow onto it.
            cluster.send("diagnosis", later, key="fabric")
            (last,) = reroutes(cluster.wait_actions(8), "d-2")
        published = routes.read()
    finally:
        routes.close()

    assert [(a.diagnosis, a.action, a.status, a.detail["state"]) for a in actions] == [
        ("d-0", "reroute", "done", "firing"),
        ("d-0", "alert", "done", "firing"),
        ("d-1", "reroute", "done", "firing"),
        ("d-1", "alert", "done", "firing"),
        ("d-1", "reroute", "done", "resolved"),
        ("d-1", "alert", "done", "resolved"),
    ]
    assert last.status == "done" and last.detail["down"] == sorted([OTHER, UNUSED])
    # Each port's two ring hops share its line rate (one phase: traffic.shared_gbps), so the
    # six hops leaving leaf-0a over its one usable uplink ask for 1.5 times its capacity.
    assert last.detail["stranded"] == [] and last.detail["after_max_util"] == 1.5
    (start,) = initial
    assert start.detail["before_max_util"] is None and start.detail["down"] == [UNUSED]
    (moved,) = reroutes(actions, "d-1")
    detail = moved.detail
    assert detail["previous"] == start.detail["plan"]
    assert detail["down"] == sorted([USED, UNUSED])
    assert (detail["before_max_util"], detail["after_max_util"]) == (
        1.0,
        1.5,
    )  # hops at half a port each
    assert detail["strategy"] == "incremental" and detail["stranded"] == []

    # Routes: every sender for the first plan; then the senders of the moved flows, once.
    by_plan: dict[str, list[tuple[str, Route]]] = {}
    for key, route in published:
        assert key == route.node
        by_plan.setdefault(route.plan, []).append((key, route))
    plan_ids = [str(start.detail["plan"]), str(detail["plan"]), str(last.detail["plan"])]
    assert sorted(by_plan) == sorted(plan_ids)
    assert all(hop.via == "spine-a-0" for _, route in by_plan[plan_ids[2]] for hop in route.paths)
    assert sorted(k for k, _ in by_plan[str(start.detail["plan"])]) == sorted(RING)
    told = by_plan[str(detail["plan"])]
    assert len(told) == detail["routes"] == len({k for k, _ in told}) >= 1
    for _, route in told:
        # A node's whole plan: every flow of this ring crosses leaf-0a, now over spine-a-1.
        assert route.paths and all(hop.via == "spine-a-1" for hop in route.paths)
        assert all(hop.port == "mlx5_0:1" for hop in route.paths)

    # The plan in force after resolution: the link given back (nothing moved onto it).
    assert current is not None
    (returned,) = reroutes(actions, "d-1", "resolved")
    assert current.id == returned.detail["plan"] and current.down == (UNUSED,)
    assert not any(USED in path.links for path in current.plan.paths)
    assert returned.detail["previous"] == detail["plan"] and returned.detail["moved"] == 0
    assert plans.history() == [last.detail["plan"], current.id, *reversed(plan_ids[:2])]
    link = cluster.state.components.component("link", USED)
    assert link is not None and link.state == "healthy"


def test_state_jobs_are_the_latest_placements_of_the_jobs_not_stopped(cluster: Cluster) -> None:
    def job(name: str, nodes: list[str], ts_ns: int, state: str = "running") -> Job:
        return Job.model_validate(job_message(name, nodes, ts_ns, state))

    state = cluster.state
    assert state.jobs.active() == []
    assert state.jobs.record(job("job-a", ["node-000", "node-001"], 10))
    assert state.jobs.record(job("job-b", ["node-002", "node-003"], 10, "restarting"))
    assert not state.jobs.record(job("job-a", ["node-004", "node-005"], 9))  # late and older
    assert state.jobs.active() == [
        job("job-a", ["node-000", "node-001"], 10),
        job("job-b", ["node-002", "node-003"], 10, "restarting"),
    ]
    assert state.jobs.record(job("job-a", ["node-000", "node-001"], 11, "stopped"))
    assert [found.job for found in state.jobs.active()] == ["job-b"]
    state.client.hset(state.keys.job("job-b"), "comms", "{broken")
    with pytest.raises(StateError, match=r"job:job-b holds no valid placement: ") as caught:
        state.jobs.active()
    assert "\n" not in str(caught.value)


def test_state_fabric_follows_the_loaded_topology(cluster: Cluster) -> None:
    state = cluster.state
    fabric = state.components.fabric()
    assert fabric is not None and USED in fabric.link_index
    assert state.components.fabric() is fabric  # parsed once while the document is the same
    state.client.set(state.keys.topology, b'{"v": 1, "kind": "topology"}')
    with pytest.raises(StateError, match=r":topology holds no valid topology: ") as caught:
        state.components.fabric()
    assert "\n" not in str(caught.value)
    state.client.delete(state.keys.topology)
    assert state.components.fabric() is None


def test_a_degraded_port_fails_over_to_its_sibling_and_comes_back_on_release(
    cluster: Cluster, receiver: HttpReceiver
) -> None:
    """Two ranks per node on GPUs 0 and 1, each on its own port (``mlx5_<gpu>:1``, plane a):
    the ring goes rail by rail, so GPU 1's port of node-008 carries two of its flows."""
    # The harness's fabric with two dual-port NICs a node.
    shape = Shape(nodes=16, spines=2, nics=2, planes=2, nodes_per_leaf=8, gpus=8)
    cluster.state.components.load_topology(generate(shape))
    plans = PlanStore(cluster.state.client, f"{cluster.key_prefix}:plan:")
    routes = Routes(cluster)
    port = "node-008/mlx5_1:1"
    ranks = [
        {"rank": 2 * i + g, "node": node, "gpu": g, "port": f"mlx5_{g}:1"}
        for i, node in enumerate(RING)
        for g in range(2)
    ]
    placement = {
        "v": 1,
        "kind": "job",
        "job": "job-p",
        "ts_ns": 1_000,
        "state": "running",
        "ranks": ranks,
        "comms": {"c0": [r["rank"] for r in ranks]},
    }
    first = diagnosis("d-0", None, [("link", UNUSED, 0.9)], cls="link_down")
    degraded = diagnosis("d-1", "job-p", [("port", port, 0.9)], cls="link_degraded")
    resolved = {**degraded, "state": "resolved", "ts_ns": degraded["ts_ns"] + 10**9}
    try:
        with worker(cluster, config(receiver)):
            cluster.send("job", placement, key="job-p")
            wait_for(lambda: cluster.state.jobs.placement("job-p"), what="placement recorded")
            cluster.send("diagnosis", first, key="fabric")
            cluster.wait_actions(2)
            before = plans.current()
            cluster.send("diagnosis", degraded, key="job-p")
            (moved,) = reroutes(cluster.wait_actions(4), "d-1")
            failed_over = plans.current()
            # Nothing slow crosses the port now: the finding resolves, the port stays out.
            cluster.send("diagnosis", resolved, key="job-p")
            (kept_out,) = reroutes(cluster.wait_actions(6), "d-1", "resolved")
            still = plans.current()
            isolated = cluster.state.components.component("port", port)
        released = subprocess.run(  # noqa: S603 -- this interpreter, our own command
            [sys.executable, "-m", "c4.cli", "state", "release", port],
            env=dict(os.environ, PYTHONPATH=str(REPO), **cluster.env()),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        back = plans.current()
        published = routes.read()
    finally:
        routes.close()

    assert before is not None and failed_over is not None and back is not None
    on_port = {p.flow: p for p in before.plan.paths if port in (p.links[0], p.links[-1])}
    # Ring 0 2 4 ... 10 1 3 ... 11: rank 3 (node-008, GPU 1) receives from 1, sends to 5.
    assert sorted(on_port) == ["job-p/c0/1->3", "job-p/c0/3->5"]
    detail = moved.detail
    assert moved.status == "done" and detail["failed_over"] == 2 and detail["moved"] == 2
    assert detail["stranded"] == [] and detail["down"] == sorted([UNUSED, port])
    assert detail["before_max_util"] == before.plan.max_util
    sibling = "node-008/mlx5_1:2"
    for flow in on_port:
        path = next(p for p in failed_over.plan.paths if p.flow == flow)
        assert sibling in (path.links[0], path.links[-1])  # the same NIC, plane b
        assert path.via is not None and path.via.startswith("spine-b-")
    # Only the two flows moved; the nodes that send them were told their whole plan.
    kept = {p.flow: p.links for p in before.plan.paths if p.flow not in on_port}
    assert all(p.links == kept[p.flow] for p in failed_over.plan.paths if p.flow in kept)
    told = [r for _, r in published if r.plan == failed_over.id]
    assert sorted(r.node for r in told) == ["node-000", "node-008"]
    hop = next(h for r in told for h in r.paths if h.flow == "job-p/c0/3->5")
    assert hop.port == "mlx5_1:2"

    assert (kept_out.status, kept_out.detail["reason"]) == ("skipped", "kept_out")
    assert still is not None and still.id == failed_over.id
    assert isolated is not None and (isolated.state, isolated.diagnosis) == ("isolated", "d-1")

    assert released.returncode == 0, released.stderr
    lines = released.stdout.strip().splitlines()
    assert lines[0].startswith(f"port {port} released")
    assert lines[1].startswith(f"back in the route plan: {port} (plan p-")
    assert "2 flows moved" in lines[1]
    assert back.down == (UNUSED,)
    assert {p.flow: p.links[0] for p in back.plan.paths if p.flow in on_port} == {
        flow: path.links[0] for flow, path in on_port.items()
    }

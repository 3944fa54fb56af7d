from __future__ import annotations

import dataclasses

from schemas.files import FabricLink, Switch, Topology, TopologyNode, TopologyPort
from schemas.messages import Diagnosis, Route, RoutePath
from streams.core.engine import Engine
from streams.core.fabric import TIE_PATIENCE, FabricCorrelator
from streams.core.slowpath import SlowPath
from tests.unit.ring_job import MS, T0, RingJob

# node-000 and node-002 hang off leaf-a0, node-001 off leaf-a1, node-003 off leaf-a2.
LEAF_OF = {0: "leaf-a0", 1: "leaf-a1", 2: "leaf-a0", 3: "leaf-a2"}
LEAVES = ("leaf-a0", "leaf-a1", "leaf-a2")


def topology(spines: int = 2) -> Topology:
    nodes = tuple(
        TopologyNode(
            id=f"node-{i:03d}",
            gpus=8,
            ports=tuple(
                TopologyPort(id=f"mlx5_{g}:1", leaf=LEAF_OF[i], gbps=200.0) for g in range(8)
            ),
        )
        for i in range(4)
    )
    switches = (
        *(Switch(id=leaf, tier=1) for leaf in LEAVES),
        *(Switch(id=f"spine-a-{s}", tier=2) for s in range(spines)),
    )
    links = tuple(
        FabricLink(id=f"{leaf}~spine-a-{s}", a=leaf, b=f"spine-a-{s}", gbps=400.0)
        for leaf in LEAVES
        for s in range(spines)
    )
    return Topology(v=1, kind="topology", nodes=nodes, switches=switches, links=links)


def routes(job: RingJob) -> list[Route]:
    """Every ring connection's planned spine: the slow ones over spine-a-0, others not."""
    out = []
    for rank in range(job.n):
        node, _, port = job.place(rank)
        flow = f"{job.job}/{job.comm}/{rank}->{(rank + 1) % job.n}"
        via = "spine-a-0" if rank in job.slow_conn or rank == 7 else "spine-a-1"
        out.append(
            Route(
                v=1,
                kind="route",
                node=node,
                ts_ns=T0,
                plan="p-1",
                paths=(RoutePath(flow=flow, port=port, via=via),),
            )
        )
    return out


def run(jobs: list[RingJob], with_topology: bool = True) -> list[Diagnosis]:
    engine = Engine(topology=topology() if with_topology else None)
    out: list[Diagnosis] = []
    for job in jobs:
        out.extend(engine.process(job.job_message()))
        for route in routes(job):
            out.extend(engine.process(route))
    messages = sorted((m for job in jobs for m in job.messages()), key=lambda m: m.ts_ns)
    for message in messages:
        out.extend(engine.process(message))
    return out


def two_jobs(slow: bool) -> list[RingJob]:
    # rank 7 -> 8 crosses leaf-a0 -> spine-a-0, then to leaf-a1 (job-1) or leaf-a2 (job-2)
    conn = {7: (40, 0.5)} if slow else {}
    return [
        RingJob(job="job-1", first_node=0, slow_conn=dict(conn), transfer_ns=20 * MS),
        RingJob(job="job-2", first_node=2, slow_conn=dict(conn), seed=2),
    ]


def test_shared_link_named_once_for_all_jobs() -> None:
    found = [d for d in run(two_jobs(slow=True)) if d.state == "firing"]
    assert [(d.class_, d.job, d.suspects[0].id) for d in found] == [
        ("link_degraded", None, "leaf-a0~spine-a-0")
    ]


def test_healthy_fabric_names_nothing() -> None:
    assert run(two_jobs(slow=False)) == []


def test_without_topology_the_job_names_the_ports_of_its_slow_path() -> None:
    found = [d for d in run(two_jobs(slow=True)[:1], with_topology=False) if d.state == "firing"]
    assert [d.class_ for d in found] == ["comm_slow"]
    assert {s.id for s in found[0].suspects} == {"node-000/mlx5_7:1", "node-001/mlx5_0:1"}


def test_paths_of_one_leaf_pair_name_the_spine_they_share() -> None:
    # Both links of one leaf pair's paths are equally suspect: the spine they share is
    # named instead, once the tie has lasted (more paths usually break it first). The two
    # slow paths leave from distinct ports (rank 7 of one job, rank 15 of the other, the
    # way back): no one port explains them.
    jobs = two_jobs(slow=True)
    jobs[0] = dataclasses.replace(jobs[0], ops=300)
    jobs[1] = RingJob(
        job="job-2", first_node=0, slow_conn={15: (40, 0.5)}, seed=2, comm="c1", ops=300
    )
    found = [d for d in run(jobs) if d.state == "firing"]
    assert [(d.class_, d.suspects[0].type, d.suspects[0].id) for d in found] == [
        ("link_degraded", "switch", "spine-a-0")
    ]


def tied_run(
    seen: list[tuple[SlowPath, bool]], topo: Topology | None = None
) -> list[tuple[str, str]]:
    """Two slow paths leaf-a0 -> leaf-a1 over spine-a-0 (its two links tie), checked until
    the tie has lasted, with the other paths ``seen``: what fired, (type, id)."""
    correlator = FabricCorrelator(topo or topology())
    slow = [
        SlowPath("job-1", "job-1/c/7->8", "node-000/mlx5_7:1", "node-001/mlx5_0:1", "spine-a-0"),
        SlowPath("job-2", "job-2/c/7->8", "node-002/mlx5_7:1", "node-001/mlx5_1:1", "spine-a-0"),
    ]
    fired = []
    for step in range(TIE_PATIENCE + 4):
        for d in correlator.check(T0 + step * 250 * MS, slow, seen):
            assert step >= TIE_PATIENCE - 1, "named before the tie lasted"
            fired.append((d.suspects[0].type, d.suspects[0].id))
    return fired


def test_a_tie_without_other_evidence_names_the_shared_switch() -> None:
    assert tied_run([]) == [("switch", "spine-a-0")]
    # Other paths over neither tied link nor the switch say nothing of them.
    other = SlowPath("job-3", "job-3/c/0->1", "node-003/mlx5_0:1", "node-001/mlx5_2:1", "spine-a-1")
    assert tied_run([(other, False), (other, True)]) == [("switch", "spine-a-0")]


def test_other_paths_break_a_tie_between_the_two_links_of_one_leaf_pair() -> None:
    # leaf-a2 -> leaf-a1 over spine-a-0 as fast as it was: spine-a-0~leaf-a1 is fine.
    into_a1 = SlowPath(
        "job-3", "job-3/c/0->1", "node-003/mlx5_0:1", "node-001/mlx5_2:1", "spine-a-0"
    )
    assert tied_run([(into_a1, False)]) == [("link", "leaf-a0~spine-a-0")]
    # The same path slower than it was (yet not slow enough to vote): that link is named.
    assert tied_run([(into_a1, True)]) == [("link", "leaf-a1~spine-a-0")]
    # leaf-a0 -> leaf-a2 over spine-a-0 slower than it was backs leaf-a0~spine-a-0.
    from_a0 = SlowPath(
        "job-3", "job-3/c/1->0", "node-002/mlx5_2:1", "node-003/mlx5_1:1", "spine-a-0"
    )
    assert tied_run([(from_a0, True)]) == [("link", "leaf-a0~spine-a-0")]
    # One path that just moved there describes its old path: no evidence yet.
    moved = dataclasses.replace(into_a1, moved_ns=T0 + TIE_PATIENCE * 250 * MS)
    assert tied_run([(moved, False)]) == [("switch", "spine-a-0")]


def test_paths_through_the_switch_over_other_links_clear_it() -> None:
    # A fourth leaf: leaf-a2 -> leaf-a3 over spine-a-0 as fast as it was crosses the switch
    # but neither tied link; the links stay tied, and nothing is named.
    base = topology()
    node = base.nodes[3].model_copy(
        update={
            "id": "node-004",
            "ports": tuple(p.model_copy(update={"leaf": "leaf-a3"}) for p in base.nodes[3].ports),
        }
    )
    links = tuple(
        FabricLink(id=f"leaf-a3~{spine}", a="leaf-a3", b=spine, gbps=400.0)
        for spine in ("spine-a-0", "spine-a-1")
    )
    topo = base.model_copy(
        update={
            "nodes": (*base.nodes, node),
            "switches": (*base.switches, Switch(id="leaf-a3", tier=1)),
            "links": (*base.links, *links),
        }
    )
    past = SlowPath("job-3", "job-3/c/0->1", "node-003/mlx5_0:1", "node-004/mlx5_0:1", "spine-a-0")
    assert tied_run([(past, False)], topo) == []
    assert tied_run([(past, True)], topo) == [("switch", "spine-a-0")]


def test_a_rerouted_path_does_not_blame_its_new_link_with_old_samples() -> None:
    correlator = FabricCorrelator(topology())
    s = 1_000_000_000

    def paths(via: str) -> list[SlowPath]:
        # Two slow connections leaf-a0 -> leaf-a1 and leaf-a0 -> leaf-a2 over one spine.
        return [
            SlowPath("job-1", "job-1/c/7->8", "node-000/mlx5_7:1", "node-001/mlx5_0:1", via),
            SlowPath("job-2", "job-2/c/7->8", "node-002/mlx5_7:1", "node-003/mlx5_0:1", via),
        ]

    fired = correlator.check(T0, paths("spine-a-1"))
    assert [(d.class_, d.suspects[0].id) for d in fired] == [("link_degraded", "leaf-a0~spine-a-1")]
    # Rerouted to spine-a-0: the same slow samples for a few more reports name nothing new.
    for step in range(1, 5):
        assert correlator.check(T0 + step * s, paths("spine-a-0")) == []
    # Still slow on the new path once its samples are its own, and more connections over
    # it with them (the leaf lost an uplink: a few slow paths over its other are the
    # squeeze, test_a_leaf_that_lost_an_uplink...): that link is named.
    more = [
        SlowPath(
            "job-3", f"job-3/c/{i}", f"node-000/mlx5_{i}:1", f"node-001/mlx5_{i}:1", "spine-a-0"
        )
        for i in (1, 2)
    ]
    fired = correlator.check(T0 + 6 * s, paths("spine-a-0") + more)
    assert [d.suspects[0].id for d in fired if d.state == "firing"] == ["leaf-a0~spine-a-0"]


def test_a_path_first_found_slow_just_after_its_plan_moved_it_waits() -> None:
    # The plan moved both connections at T0 before either was found slow: their first slow
    # reports still describe the old spine (the live run's false link_degraded).
    correlator = FabricCorrelator(topology())
    s = 1_000_000_000

    def paths(moved_ns: int | None) -> list[SlowPath]:
        return [
            SlowPath(
                "job-1",
                "job-1/c/7->8",
                "node-000/mlx5_7:1",
                "node-001/mlx5_0:1",
                "spine-a-0",
                moved_ns,
            ),
            SlowPath(
                "job-2",
                "job-2/c/7->8",
                "node-002/mlx5_7:1",
                "node-003/mlx5_0:1",
                "spine-a-0",
                moved_ns,
            ),
        ]

    for step in range(1, 5):
        assert correlator.check(T0 + step * s, paths(T0)) == []
    fired = correlator.check(T0 + 6 * s, paths(T0))
    assert [d.suspects[0].id for d in fired if d.state == "firing"] == ["leaf-a0~spine-a-0"]
    # Never moved: named at once.
    assert [d.suspects[0].id for d in FabricCorrelator(topology()).check(T0, paths(None))] == [
        "leaf-a0~spine-a-0"
    ]


def test_the_engine_knows_when_a_plan_moved_a_flow() -> None:
    engine = Engine(topology=topology())
    job = RingJob(job="job-1", first_node=0)
    for route in routes(job):
        engine.process(route)
    flow = f"{job.job}/{job.comm}/7->8"
    assert engine.routes.via(flow) == "spine-a-0" and engine.routes.moved_at(flow) is None
    for message in job.messages()[:50]:
        engine.process(message)
    moved = routes(job)[7].model_copy(
        update={"plan": "p-2", "paths": (RoutePath(flow=flow, port="mlx5_7:1", via="spine-a-1"),)}
    )
    engine.process(moved)
    assert engine.routes.via(flow) == "spine-a-1"
    assert engine.routes.moved_at(flow) == engine.now_ns > T0
    engine.process(moved)  # the same plan again: not a move
    assert engine.routes.moved_at(flow) == engine.now_ns


def test_samples_from_before_a_reroute_never_blame_the_new_path() -> None:
    # Connection 7->8 of two jobs is slow over spine-a-0 (ops 40-79); at op 80 a plan moves
    # it to spine-a-1, where it is fast. Its recent samples are still the old path's for a
    # dozen reports (one operation a second), longer than the correlator's own settling
    # time: they must not make spine-a-1 look degraded. Job-1 stays slow (its
    # connection 15->0 over spine-a-1 is slow too, one path: not enough to name a link).
    jobs = [
        RingJob(
            job="job-1",
            first_node=0,
            ops=140,
            compute_ns=1000 * MS,
            slow_conn={7: (40, 0.5), 15: (40, 0.5)},
            slow_conn_until={7: 80},
        ),
        RingJob(
            job="job-2",
            first_node=2,
            ops=140,
            compute_ns=1000 * MS,
            slow_conn={7: (40, 0.5)},
            slow_conn_until={7: 80},
            seed=2,
        ),
    ]
    engine = Engine(topology=topology())
    out: list[Diagnosis] = []
    for job in jobs:
        out.extend(engine.process(job.job_message()))
        for route in routes(job):
            out.extend(engine.process(route))
    moves = []
    for job in jobs:
        flow = f"{job.job}/{job.comm}/7->8"
        node, _, port = job.place(7)
        path = RoutePath(flow=flow, port=port, via="spine-a-1")
        moves.append(Route(v=1, kind="route", node=node, ts_ns=T0, plan="p-2", paths=(path,)))
    # The move happens when op 80 begins: the first enter report of seq 80.
    messages = sorted((m for job in jobs for m in job.messages()), key=lambda m: m.ts_ns)
    for message in messages:
        if moves and 80 in message.ops.seq:
            for move in moves:
                out.extend(engine.process(move))
            moves = []
        out.extend(engine.process(message))
    firing = [(d.class_, d.suspects[0].id) for d in out if d.state == "firing"]
    assert ("link_degraded", "leaf-a0~spine-a-0") in firing
    assert not [f for f in firing if "spine-a-1" in f[1]], firing


def leaf_a0_paths(vias: list[str]) -> list[SlowPath]:
    """Slow connections from leaf-a0 (node-000, node-002) to leaf-a1 and leaf-a2, one per
    spine given, each on a NIC port of its own."""
    paths = []
    for i, via in enumerate(vias):
        src, dst = ("node-000", "node-001") if i % 2 == 0 else ("node-002", "node-003")
        port = f"mlx5_{i}:1"
        flow = f"job-1/c/{via}/{i}"
        paths.append(SlowPath("job-1", flow, f"{src}/{port}", f"{dst}/{port}", via))
    return paths


def test_a_leaf_that_lost_an_uplink_is_slower_over_its_others_and_names_no_new_link() -> None:
    # The demo's false finding: leaf-1a~spine-a-1 went down, its flows were rerouted over
    # the leaf's other uplinks, which carry more now; their paths slow down over all of them.
    correlator = FabricCorrelator(topology(spines=3))
    s = 1_000_000_000
    fired = correlator.check(T0, leaf_a0_paths(["spine-a-1", "spine-a-1"]))
    assert [d.suspects[0].id for d in fired] == ["leaf-a0~spine-a-1"]
    squeezed = leaf_a0_paths(["spine-a-0", "spine-a-2", "spine-a-0", "spine-a-2"])
    for step in range(1, TIE_PATIENCE + 10):
        assert correlator.check(T0 + step * s, squeezed) == [], step
    assert correlator.book.open_keys(None, "link_degraded") == ["leaf-a0~spine-a-1"]


def test_a_second_faulty_uplink_of_the_leaf_stands_out_and_is_named() -> None:
    correlator = FabricCorrelator(topology(spines=3))
    s = 1_000_000_000
    correlator.check(T0, leaf_a0_paths(["spine-a-1", "spine-a-1"]))
    # A few paths over one uplink (the demo's squeeze, early on) are no proof.
    assert correlator.check(T0 + s, leaf_a0_paths(["spine-a-2", "spine-a-2"])) == []
    second = leaf_a0_paths(["spine-a-0"] * 4 + ["spine-a-2"])
    fired = correlator.check(T0 + 2 * s, second)
    assert [d.suspects[0].id for d in fired if d.state == "firing"] == ["leaf-a0~spine-a-0"]

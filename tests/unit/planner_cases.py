"""Random planner instances and an independent checker of plans, shared by the planner tests."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from schemas.files import Flows, Plan, Topology
from topology.generate import Shape, generate
from topology.model import Fabric

DEMANDS = (25.0, 50.0, 100.0, 200.0)


def make_fabric(shape: Shape, link_gbps: Sequence[float] | None = None) -> Fabric:
    topo = generate(shape)
    if link_gbps:
        data: dict[str, Any] = topo.model_dump()
        for i, link in enumerate(data["links"]):
            link["gbps"] = link_gbps[i % len(link_gbps)]
        topo = Topology.model_validate(data)
    return Fabric.from_topology(topo)


def make_flows(
    fabric: Fabric,
    pairs: Sequence[tuple[int, int]],
    demands: Sequence[float],
    down: Sequence[str] = (),
    max_degree: int | None = None,
    first_id: int = 0,
) -> Flows:
    """Flows for the reachable pairs of port numbers (optionally capping each leaf's degree)."""
    links_down = frozenset(fabric.link_indices(down))
    out_degree: dict[int, int] = defaultdict(int)
    in_degree: dict[int, int] = defaultdict(int)
    rows = []
    for i, (a, b) in enumerate(pairs):
        if a == b or a in links_down or b in links_down:
            continue
        la, lb = fabric.port_leaf[a], fabric.port_leaf[b]
        if la != lb:
            if not fabric.usable_spines(la, lb, links_down):
                continue
            if max_degree is not None and max(out_degree[la], in_degree[lb]) >= max_degree:
                continue
            out_degree[la] += 1
            in_degree[lb] += 1
        rows.append(
            {
                "id": f"f{first_id + i}",
                "src": fabric.port_ids[a],
                "dst": fabric.port_ids[b],
                "gbps": demands[i % len(demands)],
            }
        )
    return Flows.model_validate({"v": 1, "kind": "flows", "flows": rows, "down": list(down)})


@st.composite
def shapes(draw: st.DrawFn, min_spines: int = 1, max_spines: int = 6) -> Shape:
    return Shape(
        nodes=draw(st.integers(2, 24)),
        spines=draw(st.integers(min_spines, max_spines)),
        nics=draw(st.integers(1, 3)),
        planes=draw(st.sampled_from([1, 2])),
        nodes_per_leaf=draw(st.integers(1, 4)),
        port_gbps=draw(st.sampled_from([100.0, 200.0])),
        uplink_gbps=draw(st.sampled_from([100.0, 200.0, 400.0])),
    )


@st.composite
def instances(
    draw: st.DrawFn,
    equal: bool = True,
    with_down: bool = False,
    vary_caps: bool = False,
    enough_spines: bool = False,
) -> tuple[Fabric, Flows]:
    shape = draw(
        shapes(min_spines=4 if enough_spines else 1, max_spines=12 if enough_spines else 6)
    )
    caps = draw(st.lists(st.sampled_from([100.0, 200.0, 400.0]), min_size=1, max_size=7))
    fabric = make_fabric(shape, caps if vary_caps else None)
    ports = len(fabric.port_ids)
    pairs = draw(
        st.lists(st.tuples(st.integers(0, ports - 1), st.integers(0, ports - 1)), max_size=60)
    )
    fabric_links = list(fabric.link_ids[ports:])
    down = (
        draw(st.lists(st.sampled_from(fabric_links), max_size=3, unique=True)) if with_down else []
    )
    if equal:
        demands = [draw(st.sampled_from(DEMANDS))]
    else:
        demands = draw(st.lists(st.sampled_from(DEMANDS), min_size=1, max_size=8))
    degree = shape.spines if enough_spines else None
    return fabric, make_flows(fabric, pairs, demands, down, degree)


def random_instance(seed: int, kind: str) -> tuple[Fabric, Flows]:
    """A seeded instance: kind is ``unequal``, ``down`` or ``caps``."""
    r = random.Random(seed)
    shape = Shape(
        nodes=r.randint(2, 24),
        spines=r.randint(1, 6),
        nics=r.randint(1, 3),
        planes=r.randint(1, 2),
        nodes_per_leaf=r.randint(1, 4),
        port_gbps=r.choice([100.0, 200.0]),
        uplink_gbps=r.choice([100.0, 200.0, 400.0]),
    )
    caps = [r.choice([100.0, 200.0, 400.0]) for _ in range(7)] if kind == "caps" else None
    fabric = make_fabric(shape, caps)
    ports = len(fabric.port_ids)
    pairs = [(r.randrange(ports), r.randrange(ports)) for _ in range(r.randint(1, 80))]
    fabric_links = list(fabric.link_ids[ports:])
    down = r.sample(fabric_links, min(len(fabric_links), r.randint(1, 3))) if kind == "down" else []
    demands = [r.choice(DEMANDS) for _ in range(8)] if kind != "down" else [100.0]
    return fabric, make_flows(fabric, pairs, demands, down)


def check_plan(fabric: Fabric, flows: Flows, plan: Plan, down: Sequence[str] = ()) -> None:
    """Every path valid for its flow and avoiding down links; max_util as the contract says."""
    avoid = set(down) | set(flows.down)
    assert [path.flow for path in plan.paths] == [flow.id for flow in flows.flows]
    load: dict[tuple[str, int], float] = defaultdict(float)
    for flow, path in zip(flows.flows, plan.paths, strict=True):
        src, dst = fabric.ports[flow.src], fabric.ports[flow.dst]
        assert fabric.plane_of(flow.src) == fabric.plane_of(flow.dst)
        assert path.links[0] == flow.src and path.links[-1] == flow.dst
        assert not avoid & set(path.links)
        if src.leaf == dst.leaf:
            assert path.via is None and len(path.links) == 2
        else:
            assert path.via is not None and len(path.links) == 4
            spine = fabric.spine_index[path.via]
            assert fabric.spine_plane[spine] == fabric.plane_of(flow.src).index
            for leaf, link in ((src.leaf, path.links[1]), (dst.leaf, path.links[2])):
                index = fabric.link_index[link]
                assert fabric.leaves[fabric.link_leaf[index]] == leaf
                assert fabric.spines[fabric.link_spine[index]] == path.via
        half = len(path.links) // 2
        for k, link in enumerate(path.links):
            load[(link, 0 if k < half else 1)] += flow.gbps  # up to the spine, then down
    expected = max((x / fabric.capacity(link) for (link, _), x in load.items()), default=0.0)
    assert math.isclose(plan.max_util, expected, rel_tol=1e-9, abs_tol=1e-12)

from __future__ import annotations

from typing import Any

import pytest

from schemas.files import Topology
from topology import TopologyError
from topology.generate import Shape, generate
from topology.model import DOWN, UP, Fabric, FabricShapeError, UnknownPortError, UnreachableError


def small_fabric() -> Fabric:
    return Fabric.from_topology(generate(Shape(nodes=16, spines=4, nics=2)))


def topology(links: list[dict[str, Any]], switches: list[dict[str, Any]]) -> Topology:
    return Topology.model_validate(
        {
            "v": 1,
            "kind": "topology",
            "nodes": [
                {"id": "n0", "gpus": 1, "ports": [{"id": "p", "leaf": "l0", "gbps": 100.0}]},
                {"id": "n1", "gpus": 1, "ports": [{"id": "p", "leaf": "l1", "gbps": 100.0}]},
                {"id": "n2", "gpus": 1, "ports": [{"id": "p", "leaf": "l2", "gbps": 100.0}]},
                {"id": "n9", "gpus": 1, "ports": [{"id": "p", "leaf": "l9", "gbps": 100.0}]},
            ],
            "switches": switches,
            "links": links,
        }
    )


def test_ports_leaves_spines_and_planes_are_derived() -> None:
    fabric = small_fabric()
    assert len(fabric.ports) == 16 * 2 * 2
    assert fabric.ports["node-009/mlx5_1:2"].leaf == "leaf-1b"
    assert len(fabric.leaves) == 4 and len(fabric.spines) == 8
    assert [plane.leaves for plane in fabric.planes] == [
        ("leaf-0a", "leaf-1a"),
        ("leaf-0b", "leaf-1b"),
    ]
    assert fabric.planes[1].spines == tuple(f"spine-b-{i}" for i in range(4))
    assert fabric.plane_of("node-000/mlx5_0:1").index == 0
    assert fabric.plane_of("node-000/mlx5_0:2").index == 1


def test_cables_are_named_by_their_port_and_fabric_links_by_their_id() -> None:
    fabric = small_fabric()
    assert fabric.capacity("node-000/mlx5_0:1") == 200.0
    assert fabric.capacity("leaf-0a~spine-a-3") == 400.0
    port = fabric.port_index["node-003/mlx5_1:1"]
    assert fabric.link_ids[port] == "node-003/mlx5_1:1"  # a port's cable is link number == port
    assert fabric.directed_gbps[2 * port + UP] == fabric.directed_gbps[2 * port + DOWN] == 200.0


def test_paths_between_leaves_one_per_spine_in_plan_link_order() -> None:
    paths = small_fabric().paths("node-000/mlx5_0:1", "node-008/mlx5_0:1")
    assert [path.via for path in paths] == [f"spine-a-{i}" for i in range(4)]
    assert paths[3].links == (
        "node-000/mlx5_0:1",
        "leaf-0a~spine-a-3",
        "leaf-1a~spine-a-3",
        "node-008/mlx5_0:1",
    )


def test_same_leaf_path_is_the_two_cables() -> None:
    (path,) = small_fabric().paths("node-000/mlx5_0:1", "node-007/mlx5_1:1")
    assert path.via is None
    assert path.links == ("node-000/mlx5_0:1", "node-007/mlx5_1:1")


def test_different_planes_are_unreachable_with_one_line_naming_ports_and_planes() -> None:
    with pytest.raises(UnreachableError) as caught:
        small_fabric().paths("node-000/mlx5_0:1", "node-008/mlx5_0:2")
    message = str(caught.value)
    assert "\n" not in message
    for part in (
        "node-000/mlx5_0:1",
        "node-008/mlx5_0:2",
        "plane 0",
        "plane 1",
        "different planes",
    ):
        assert part in message
    assert isinstance(caught.value, TopologyError)


def test_unknown_port() -> None:
    with pytest.raises(UnknownPortError, match="node-099/mlx5_0:1"):
        small_fabric().paths("node-099/mlx5_0:1", "node-000/mlx5_0:1")


def test_unlisted_leaf_is_implied_and_no_common_spine_is_unreachable() -> None:
    switches = [{"id": x, "tier": 1} for x in ("l0", "l1", "l2")]
    switches += [{"id": "s0", "tier": 2}, {"id": "s1", "tier": 2}]
    fabric = Fabric.from_topology(
        topology(
            [
                {"id": "l0~s0", "a": "l0", "b": "s0", "gbps": 100.0},
                {"id": "s0~l1", "a": "s0", "b": "l1", "gbps": 100.0},
                {"id": "l1~s1", "a": "l1", "b": "s1", "gbps": 100.0},
                {"id": "l2~s1", "a": "l2", "b": "s1", "gbps": 100.0},
            ],
            switches,
        )
    )
    assert fabric.leaves == ("l0", "l1", "l2", "l9")
    assert [plane.leaves for plane in fabric.planes] == [("l0", "l1", "l2"), ("l9",)]
    (path,) = fabric.paths("n0/p", "n1/p")
    assert path.links == ("n0/p", "l0~s0", "s0~l1", "n1/p")  # either end order names a link
    with pytest.raises(UnreachableError, match="no spine is linked to both leaves"):
        fabric.paths("n0/p", "n2/p")
    # l9 is alone in a plane of its own because nothing links it: said as such, not as
    # "different planes" of a fabric that has one.
    with pytest.raises(UnreachableError, match="l9 has no uplink to a spine"):
        fabric.paths("n0/p", "n9/p")
    assert fabric.cut_off("n9/p") == "l9"
    assert fabric.cut_off("n0/p") is None


def test_not_a_two_tier_fabric_is_rejected() -> None:
    spines = [{"id": "s0", "tier": 2}, {"id": "s1", "tier": 2}, {"id": "l0", "tier": 1}]
    with pytest.raises(FabricShapeError, match="two tier-2 switches"):
        Fabric.from_topology(topology([{"id": "x", "a": "s0", "b": "s1", "gbps": 1.0}], spines))
    parallel = [
        {"id": "a", "a": "l0", "b": "s0", "gbps": 1.0},
        {"id": "b", "a": "s0", "b": "l0", "gbps": 1.0},
    ]
    with pytest.raises(FabricShapeError, match="parallel links"):
        Fabric.from_topology(topology(parallel, spines))


def test_usable_spines_drop_down_links() -> None:
    fabric = small_fabric()
    a, b = fabric.leaf_index["leaf-0a"], fabric.leaf_index["leaf-1a"]
    down = frozenset(fabric.link_indices(["leaf-0a~spine-a-1", "leaf-1a~spine-a-2"]))
    assert fabric.usable_spines(a, b, down) == (
        fabric.spine_index["spine-a-0"],
        fabric.spine_index["spine-a-3"],
    )

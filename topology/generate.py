"""Standard fabric shapes as v1 topologies, for tests, benchmarks and the demo.

Nodes are grouped ``nodes_per_leaf`` at a time; every NIC is dual-port and each port has its
own leaf. With two planes, port 1 of every NIC of group ``g`` goes to ``leaf-<g>a`` (plane a)
and port 2 to ``leaf-<g>b`` (plane b); with one plane, to ``leaf-<2g>a`` and ``leaf-<2g+1>a``.
Every leaf links to every spine of its plane (``spine-<plane>-<i>``): a full 2-tier Clos.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.base import MAX_ITEMS
from schemas.files import Topology
from topology import TopologyError

PLANE_NAMES = "ab"
DEFAULT_NODES_PER_LEAF = 8
MAX_PORTS_PER_NODE = 1024  # the topology schema's bound


class ShapeError(TopologyError):
    """A fabric shape that cannot be generated; the message names the option."""


@dataclass(frozen=True, slots=True)
class Shape:
    """The parameters of ``c4 topology gen``; None means derived from the others."""

    nodes: int
    spines: int
    nics: int = 8
    planes: int = 2
    leaves_per_plane: int | None = None
    nodes_per_leaf: int | None = None
    port_gbps: float = 200.0
    uplink_gbps: float = 400.0
    gpus: int = 8


@dataclass(frozen=True, slots=True)
class Layout:
    """A shape with every derived number filled in."""

    shape: Shape
    nodes_per_leaf: int
    leaves_per_plane: int


def layout(shape: Shape) -> Layout:
    """Check a shape and derive leaves per plane and nodes per leaf; raises `ShapeError`."""
    _at_least("--nodes", shape.nodes, 1)
    _at_least("--spines", shape.spines, 1)
    _at_least("--nics", shape.nics, 1)
    _at_least("--gpus", shape.gpus, 0)
    if shape.planes not in (1, 2):
        error = f"--planes must be 1 or 2 (dual-port NICs), got {shape.planes}"
        raise ShapeError(error)
    for option, gbps in (("--port-gbps", shape.port_gbps), ("--uplink-gbps", shape.uplink_gbps)):
        if not (math.isfinite(gbps) and gbps > 0):
            error = f"{option} must be a positive number, got {gbps}"
            raise ShapeError(error)
    if 2 * shape.nics > MAX_PORTS_PER_NODE:
        error = f"--nics must be at most {MAX_PORTS_PER_NODE // 2}, got {shape.nics}"
        raise ShapeError(error)
    if shape.nodes > MAX_ITEMS:
        error = f"--nodes must be at most {MAX_ITEMS}, got {shape.nodes}"
        raise ShapeError(error)
    # With one plane each node group needs two leaves: its NICs' port 1 and port 2.
    leaves_per_group = 3 - shape.planes
    per_leaf, per_plane = shape.nodes_per_leaf, shape.leaves_per_plane
    if per_leaf is not None:
        _at_least("--nodes-per-leaf", per_leaf, 1)
    if per_plane is not None:
        _at_least("--leaves-per-plane", per_plane, leaves_per_group)
        if per_plane % leaves_per_group:
            error = f"--leaves-per-plane must be even with --planes 1, got {per_plane}"
            raise ShapeError(error)
    if per_leaf is None:
        groups = per_plane // leaves_per_group if per_plane else None
        per_leaf = math.ceil(shape.nodes / groups) if groups else DEFAULT_NODES_PER_LEAF
    needed = math.ceil(shape.nodes / per_leaf) * leaves_per_group
    if per_plane is None:
        per_plane = needed
    elif per_plane < needed:
        error = (
            f"--leaves-per-plane {per_plane} is too few: {shape.nodes} nodes at "
            f"{per_leaf} per leaf need {needed}"
        )
        raise ShapeError(error)
    switches = (per_plane + shape.spines) * shape.planes
    if switches > MAX_ITEMS or per_plane * shape.spines * shape.planes > 4 * MAX_ITEMS:
        error = f"{switches} switches and {per_plane * shape.spines * shape.planes} links: too many"
        raise ShapeError(error)
    return Layout(shape, per_leaf, per_plane)


def generate(shape: Shape) -> Topology:
    """The v1 topology of a shape (validated by the schema model); raises `ShapeError`."""
    plan = layout(shape)
    width = max(3, len(str(shape.nodes - 1)))
    planes = PLANE_NAMES[: shape.planes]
    nodes = []
    for n in range(shape.nodes):
        group = n // plan.nodes_per_leaf
        ports = []
        for nic in range(shape.nics):
            for side in (1, 2):
                if shape.planes == 2:
                    leaf = f"leaf-{group}{planes[side - 1]}"
                else:
                    leaf = f"leaf-{2 * group + side - 1}a"
                ports.append({"id": f"mlx5_{nic}:{side}", "leaf": leaf, "gbps": shape.port_gbps})
        nodes.append({"id": f"node-{n:0{width}d}", "gpus": shape.gpus, "ports": ports})
    switches: list[dict[str, object]] = []
    links = []
    for plane in planes:
        leaves = [f"leaf-{i}{plane}" for i in range(plan.leaves_per_plane)]
        spines = [f"spine-{plane}-{i}" for i in range(shape.spines)]
        switches += [{"id": leaf, "tier": 1} for leaf in leaves]
        switches += [{"id": spine, "tier": 2} for spine in spines]
        links += [
            {"id": f"{leaf}~{spine}", "a": leaf, "b": spine, "gbps": shape.uplink_gbps}
            for leaf in leaves
            for spine in spines
        ]
    return Topology.model_validate(
        {"v": 1, "kind": "topology", "nodes": nodes, "switches": switches, "links": links}
    )


def _at_least(option: str, value: int, low: int) -> None:
    if value < low:
        error = f"{option} must be at least {low}, got {value}"
        raise ShapeError(error)

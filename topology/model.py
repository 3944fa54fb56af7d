"""The fabric of a v1 topology: ports, leaves, spines, planes, capacities, links and paths.

Links have two names. Outside, a link is its contract id: a port's cable is the port's global
id (``node-000/mlx5_0:1``), a fabric link its topology id (``leaf-0a~spine-a-3``). Inside, a
link is an int: the cables first, in port order (so port ``i``'s cable is link ``i``), then the
fabric links. Links are full duplex; a directed link is ``2 * link + UP`` or ``2 * link + DOWN``,
so hot loops index flat lists instead of hashing strings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from schemas.files import Topology
from topology import TopologyError

UP = 0  # away from the node: port to leaf, leaf to spine
DOWN = 1  # towards the node: spine to leaf, leaf to port


class FabricShapeError(TopologyError):
    """The topology is not a 2-tier leaf-spine fabric."""


class UnknownPortError(TopologyError):
    """A port id that the topology does not have."""


class UnknownLinkError(TopologyError):
    """A link id that the topology does not have."""


class UnreachableError(TopologyError):
    """No 2-tier path joins two ports (different planes, no common spine, all links down)."""


@dataclass(frozen=True, slots=True)
class Port:
    """A NIC port: its global id ``node/port``, its node, the leaf its cable goes to."""

    id: str
    node: str
    leaf: str
    gbps: float


@dataclass(frozen=True, slots=True)
class Plane:
    """A connected component of leaves and spines; the contract has no plane field."""

    index: int
    leaves: tuple[str, ...]
    spines: tuple[str, ...]

    @property
    def name(self) -> str:
        """``plane 0``: planes are numbered in order of their first leaf."""
        return f"plane {self.index}"


@dataclass(frozen=True, slots=True)
class Path:
    """A path between two ports: the spine used (None within one leaf) and every link."""

    via: str | None
    links: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Fabric:
    """A 2-tier leaf-spine fabric, with string ids outside and int tables for the planner."""

    ports: Mapping[str, Port]
    leaves: tuple[str, ...]
    spines: tuple[str, ...]
    planes: tuple[Plane, ...]
    port_ids: tuple[str, ...]
    port_index: Mapping[str, int]
    port_leaf: tuple[int, ...]
    leaf_index: Mapping[str, int]
    spine_index: Mapping[str, int]
    leaf_plane: tuple[int, ...]
    spine_plane: tuple[int, ...]
    plane_spines: tuple[tuple[int, ...], ...]
    # Per plane: every leaf linked to every spine (then any two leaves share all spines).
    full_mesh: tuple[bool, ...]
    link_ids: tuple[str, ...]
    link_index: Mapping[str, int]
    link_gbps: tuple[float, ...]
    # Per leaf: spine index -> link index of the leaf~spine link.
    uplinks: tuple[Mapping[int, int], ...]
    # Per link: its leaf (a cable's leaf, or the leaf end) and its spine (-1 for a cable).
    link_leaf: tuple[int, ...]
    link_spine: tuple[int, ...]
    # Capacity per directed link (index 2 * link + direction), for flat-list arithmetic.
    directed_gbps: tuple[float, ...]
    _common: dict[tuple[int, int], tuple[int, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @classmethod
    def from_topology(cls, topology: Topology) -> Fabric:
        """Build the fabric of a validated v1 topology; raises `FabricShapeError`."""
        return _build(topology)

    def port(self, port_id: str) -> Port:
        """The port of a global id, or `UnknownPortError`."""
        found = self.ports.get(port_id)
        if found is None:
            error = f"unknown port {port_id!r}"
            raise UnknownPortError(error)
        return found

    def index_of(self, port_id: str) -> int:
        """The int id of a port, or `UnknownPortError`."""
        found = self.port_index.get(port_id)
        if found is None:
            error = f"unknown port {port_id!r}"
            raise UnknownPortError(error)
        return found

    def plane_of(self, port_id: str) -> Plane:
        """The plane a port's leaf belongs to."""
        return self.planes[self.leaf_plane[self.leaf_index[self.port(port_id).leaf]]]

    def cut_off(self, port_id: str) -> str | None:
        """The port's leaf when it has no uplink to any spine (a leaf alone in its plane,
        whatever the fabric's planes), else None."""
        leaf = self.leaf_index[self.port(port_id).leaf]
        return None if self.uplinks[leaf] else self.leaves[leaf]

    def capacity(self, link_id: str) -> float:
        """A link's capacity in Gbps (each direction)."""
        return self.link_gbps[self.link_indices((link_id,))[0]]

    def link_indices(self, link_ids: Iterable[str]) -> tuple[int, ...]:
        """The int ids of link ids, or `UnknownLinkError` naming the first unknown one."""
        index = self.link_index
        found: list[int] = []
        for link_id in link_ids:
            number = index.get(link_id)
            if number is None:
                error = f"unknown link {link_id!r}"
                raise UnknownLinkError(error)
            found.append(number)
        return tuple(found)

    def common_spines(self, leaf_a: int, leaf_b: int) -> tuple[int, ...]:
        """The spines linked to both leaves, in spine order (cached: few distinct pairs)."""
        key = (leaf_a, leaf_b)
        spines = self._common.get(key)
        if spines is None:
            other = self.uplinks[leaf_b]
            spines = tuple(sorted(s for s in self.uplinks[leaf_a] if s in other))
            self._common[key] = spines
        return spines

    def usable_spines(
        self, leaf_a: int, leaf_b: int, down: frozenset[int] = frozenset()
    ) -> tuple[int, ...]:
        """The common spines whose two links are both up: the ECMP group of a leaf pair."""
        spines = self.common_spines(leaf_a, leaf_b)
        if not down:
            return spines
        up_a, up_b = self.uplinks[leaf_a], self.uplinks[leaf_b]
        return tuple(s for s in spines if up_a[s] not in down and up_b[s] not in down)

    def paths(self, src: str, dst: str) -> tuple[Path, ...]:
        """Every 2-tier path from one port to another, or `UnreachableError`.

        Same leaf: the two cables, via None. Otherwise one path per spine linked to both
        leaves, in spine order: source cable, leaf~spine up, spine~leaf down, destination cable.
        """
        source, target = self.index_of(src), self.index_of(dst)
        if source == target:
            error = f"no path from {src} to itself"
            raise UnreachableError(error)
        leaf_a, leaf_b = self.port_leaf[source], self.port_leaf[target]
        if leaf_a == leaf_b:
            return (Path(None, (src, dst)),)
        spines = self.common_spines(leaf_a, leaf_b)
        if not spines:
            raise self.unreachable(source, target)
        ups, downs, names = self.uplinks[leaf_a], self.uplinks[leaf_b], self.link_ids
        return tuple(
            Path(self.spines[s], (src, names[ups[s]], names[downs[s]], dst)) for s in spines
        )

    def unreachable(self, source: int, target: int, down: bool = False) -> UnreachableError:
        """The error for two port indices with no usable path, saying why in one line."""
        leaf_a, leaf_b = self.port_leaf[source], self.port_leaf[target]
        plane_a, plane_b = (
            self.planes[self.leaf_plane[leaf_a]],
            self.planes[self.leaf_plane[leaf_b]],
        )
        src, dst = self.port_ids[source], self.port_ids[target]
        where = f"{src} (on {self.leaves[leaf_a]}, {plane_a.name})"
        there = f"{dst} (on {self.leaves[leaf_b]}, {plane_b.name})"
        cut_off = next((self.leaves[x] for x in (leaf_a, leaf_b) if not self.uplinks[x]), None)
        if cut_off is not None:
            why = f"{cut_off} has no uplink to a spine"
        elif plane_a.index != plane_b.index:
            why = "the ports are in different planes"
        elif down:
            why = "every path crosses a down link"
        else:
            why = "no spine is linked to both leaves"
        message = f"no path from {where} to {there}: {why}"
        return UnreachableError(message)


def _build(topology: Topology) -> Fabric:
    tiers = {switch.id: switch.tier for switch in topology.switches}
    leaves: list[str] = [s.id for s in topology.switches if s.tier == 1]
    spines: list[str] = [s.id for s in topology.switches if s.tier == 2]
    leaf_index = {leaf: i for i, leaf in enumerate(leaves)}
    ports: dict[str, Port] = {}
    port_leaf: list[int] = []
    for node in topology.nodes:
        for local in node.ports:
            if local.leaf not in leaf_index:  # an unlisted leaf is implied (contract rule)
                leaf_index[local.leaf] = len(leaves)
                leaves.append(local.leaf)
            port = Port(f"{node.id}/{local.id}", node.id, local.leaf, local.gbps)
            ports[port.id] = port
            port_leaf.append(leaf_index[local.leaf])
    spine_index = {spine: i for i, spine in enumerate(spines)}
    port_ids = tuple(ports)
    link_ids: list[str] = list(port_ids)
    link_gbps: list[float] = [port.gbps for port in ports.values()]
    link_leaf: list[int] = list(port_leaf)
    link_spine: list[int] = [-1] * len(port_ids)
    uplinks: list[dict[int, int]] = [{} for _ in leaves]
    for link in topology.links:
        if tiers[link.a] == tiers[link.b]:
            error = (
                f"link {link.id!r} joins two tier-{tiers[link.a]} switches; "
                "a 2-tier fabric links leaves to spines"
            )
            raise FabricShapeError(error)
        leaf, spine = (link.a, link.b) if tiers[link.a] == 1 else (link.b, link.a)
        if link.id in ports:
            error = f"link id {link.id!r} is also a port id"
            raise FabricShapeError(error)
        own = uplinks[leaf_index[leaf]]
        if spine_index[spine] in own:
            error = f"links {link_ids[own[spine_index[spine]]]!r} and {link.id!r} both join "
            error += f"{leaf} and {spine}; parallel links are not supported"
            raise FabricShapeError(error)
        own[spine_index[spine]] = len(link_ids)
        link_ids.append(link.id)
        link_gbps.append(link.gbps)
        link_leaf.append(leaf_index[leaf])
        link_spine.append(spine_index[spine])
    leaf_plane, spine_plane, planes = _planes(leaves, spines, uplinks)
    plane_spines = tuple(tuple(spine_index[s] for s in plane.spines) for plane in planes)
    directed = tuple(gbps for gbps in link_gbps for _ in (UP, DOWN))
    return Fabric(
        ports=ports,
        leaves=tuple(leaves),
        spines=tuple(spines),
        planes=planes,
        port_ids=port_ids,
        port_index={port_id: i for i, port_id in enumerate(port_ids)},
        port_leaf=tuple(port_leaf),
        leaf_index=leaf_index,
        spine_index=spine_index,
        leaf_plane=leaf_plane,
        spine_plane=spine_plane,
        plane_spines=plane_spines,
        full_mesh=tuple(
            bool(spines_of)
            and all(len(uplinks[leaf_index[leaf]]) == len(spines_of) for leaf in plane.leaves)
            for plane, spines_of in zip(planes, plane_spines, strict=True)
        ),
        link_ids=tuple(link_ids),
        link_index={link_id: i for i, link_id in enumerate(link_ids)},
        link_gbps=tuple(link_gbps),
        uplinks=tuple(uplinks),
        link_leaf=tuple(link_leaf),
        link_spine=tuple(link_spine),
        directed_gbps=directed,
    )


def _planes(
    leaves: list[str], spines: list[str], uplinks: list[dict[int, int]]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[Plane, ...]]:
    """Connected components of the leaf-spine graph (union-find; spines after the leaves)."""
    parent = list(range(len(leaves) + len(spines)))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for leaf, own in enumerate(uplinks):
        for spine in own:
            a, b = root(leaf), root(len(leaves) + spine)
            if a != b:
                parent[max(a, b)] = min(a, b)
    # Planes are numbered in order of their first leaf (then of lone spines): stable names.
    number: dict[int, int] = {}
    members: list[tuple[list[str], list[str]]] = []
    assigned: list[int] = []
    for x in range(len(parent)):
        r = root(x)
        if r not in number:
            number[r] = len(members)
            members.append(([], []))
        assigned.append(number[r])
        if x < len(leaves):
            members[number[r]][0].append(leaves[x])
        else:
            members[number[r]][1].append(spines[x - len(leaves)])
    planes = tuple(Plane(i, tuple(ls), tuple(ss)) for i, (ls, ss) in enumerate(members))
    return tuple(assigned[: len(leaves)]), tuple(assigned[len(leaves) :]), planes

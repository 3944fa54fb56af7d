"""Where a scenario runs: its jobs placed on the topology, their communicators and rings.

Rank ``r`` of a job runs on the job's node ``r // 8``, GPU ``r % 8``, NIC port ``mlx5_<gpu>:1``.
A communicator's connections are the hops of `topology.traffic` (the model the planner uses
too): a hop between two nodes leaves through the sender's port and arrives at the receiver's,
crossing a leaf~spine~leaf path between two leaves (the spine chosen by the fabric's ECMP
hash, as a real leaf would); a hop inside a node is NVLink; a communicator inside one node has
no connection on a port at all.

An expert group of more than two members over several nodes runs its all-to-all as all pairs
(`traffic.all_pairs`: every ordered pair of members on different nodes, the planner's flows),
its ``pairs``; a member's port shares its line rate among its pairs (`traffic.shared_gbps`).
Its ``ring`` (the ring hops, each the pair of the same two members, same source port and
path) is what the agents report a member's connections by. With two members the pairs are
the ring's two hops: no ``pairs``, as before.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from schemas.files import Topology, TopologyNode
from simulator.layout import GPUS_PER_NODE as GPUS_PER_NODE
from simulator.layout import Group, groups
from simulator.scenario import (
    FabricLinkDegraded,
    FabricLinkDown,
    JobSpec,
    LinkDown,
    NodeDown,
    PortDegraded,
    Scenario,
    ScenarioError,
)
from topology import TopologyError
from topology.ecmp import SPORT_MAX, SPORT_MIN, Crc32Hash, Ecmp
from topology.generate import Shape, generate
from topology.model import Fabric
from topology.traffic import all_pairs, network_hops, ring_hops, shared_gbps

NVLINK_GBPS = 2400.0  # ~300 GB/s per direction: tensor-parallel rings stay inside a node
_NODE_NUMBER = re.compile(r"^node-(\d+)$")


@dataclass(frozen=True, slots=True)
class Conn:
    """One connection, member ``src`` to its ring successor: the ports and links it crosses."""

    src: int
    dst: int
    # Global port ids, ``node-000/mlx5_0:1``; None for a hop over NVLink inside a node.
    src_port: str | None
    dst_port: str | None
    via: str | None
    links: tuple[str, ...]  # fabric links crossed, leaf~spine up then down
    gbps: float  # nominal: the ports' speed and each fabric link's fair share
    sport: int  # the UDP source port the leaf's ECMP hash saw


@dataclass(frozen=True, slots=True)
class Comm:
    """A communicator: its id, members (global ranks, comm-rank order) and its ring."""

    id: str
    name: str
    kind: str  # "dp", "tp", "ep" or "pp" (a point-to-point pair of neighbouring stages)
    members: tuple[int, ...]
    # None: NVLink inside one node, no NIC port involved. Else one connection per member,
    # ``ring[k].src == k``; a pair's ring is its two directions.
    ring: tuple[Conn, ...] | None
    # Per member: the member whose connection arrives at it (its ring predecessor).
    prev: tuple[int, ...] = ()
    # An expert group's all-to-all as all pairs (see the module doc); None: its ring's hops.
    pairs: tuple[Conn, ...] | None = None

    def network(self) -> tuple[Conn, ...]:
        """The connections on NIC ports (a hop between two nodes), in sender order."""
        return tuple(conn for conn in self.ring or () if conn.src_port is not None)

    def traffic(self) -> tuple[Conn, ...]:
        """The connections that carry its bytes over NIC ports: the pairs of an all-to-all
        run as all pairs, else `network`."""
        return self.pairs if self.pairs is not None else self.network()

    def on_port(self, member: int) -> bool:
        """Whether the member sends or receives on its NIC port in this communicator."""
        if self.ring is None:
            return False
        return (
            self.ring[member].src_port is not None
            or self.ring[self.prev[member]].src_port is not None
        )


@dataclass(frozen=True, slots=True)
class PlacedJob:
    """A job with its nodes and communicators."""

    spec: JobSpec
    nodes: tuple[str, ...]
    comms: tuple[Comm, ...]

    def node_of(self, rank: int) -> str:
        """The node a global rank runs on."""
        return self.nodes[rank // GPUS_PER_NODE]

    def gpu_id(self, rank: int) -> str:
        """The contract's GPU id of a global rank."""
        return f"{self.node_of(rank)}/gpu{rank % GPUS_PER_NODE}"

    def port_id(self, rank: int) -> str:
        """The global id of the NIC port a rank's traffic uses."""
        return f"{self.node_of(rank)}/{local_port(rank % GPUS_PER_NODE)}"


@dataclass(frozen=True, slots=True)
class Cluster:
    """The topology and every placed job."""

    topology: Topology
    jobs: tuple[PlacedJob, ...]
    nodes: Mapping[str, TopologyNode]
    fabric_links: frozenset[str]

    def job(self, job_id: str) -> PlacedJob:
        """A placed job by id (the scenario was validated: it exists)."""
        return next(job for job in self.jobs if job.spec.id == job_id)

    def job_on_node(self, node: str) -> PlacedJob | None:
        """The job running on a node, if any (nodes are not shared)."""
        return next((job for job in self.jobs if node in job.nodes), None)

    def path_links(self, src_port: str, dst_port: str, via: str | None) -> tuple[str, ...]:
        """The fabric links between two ports through spine ``via`` (none within one leaf)."""
        leaf_of = {
            f"{node.id}/{port.id}": port.leaf for node in self.topology.nodes for port in node.ports
        }
        src, dst = leaf_of.get(src_port), leaf_of.get(dst_port)
        if via is None or src is None or dst is None or src == dst:
            return ()
        named = {frozenset((link.a, link.b)): link.id for link in self.topology.links}
        return tuple(
            named[pair] for pair in (frozenset((src, via)), frozenset((dst, via))) if pair in named
        )


def local_port(gpu: int) -> str:
    """The NIC port of a GPU, inside its node."""
    return f"mlx5_{gpu}:1"


def comm_id(job: str, name: str) -> str:
    """A communicator id: a short hex hash of job and name, the same on every member."""
    return hashlib.blake2s(f"{job}/{name}".encode(), digest_size=6).hexdigest()


def build_cluster(
    topology: Topology | None, scenario: Scenario, spines: Mapping[str, str] | None = None
) -> Cluster:
    """Place the scenario's jobs; generate a fitting topology when none is given.

    ``spines`` (flow id -> spine) routes those connections as a plan says, not by the
    leaves' ECMP hash: what a fabric running the plan's routes carries.
    """
    if topology is None:
        topology = default_topology(scenario)
    try:
        fabric = Fabric.from_topology(topology)
    except TopologyError as error:
        message = f"topology: {error}"
        raise ScenarioError(message) from error
    nodes = {node.id: node for node in topology.nodes}
    placements = _place(scenario, topology, nodes)
    rings = {
        spec.id: _rings(spec, job_nodes)
        for spec, job_nodes in zip(scenario.jobs, placements, strict=True)
    }
    routes, shares = _routes(fabric, rings, spines or {})
    speeds = dict(zip(fabric.link_ids, fabric.link_gbps, strict=True))
    jobs = tuple(
        _job(spec, job_nodes, rings[spec.id], routes, shares, speeds)
        for spec, job_nodes in zip(scenario.jobs, placements, strict=True)
    )
    fabric_links = frozenset(link.id for link in topology.links)
    cluster = Cluster(topology, jobs, nodes, fabric_links)
    _check_faults(scenario, cluster)
    return cluster


def default_topology(scenario: Scenario) -> Topology:
    """A leaf-spine fabric just big enough for the scenario's jobs and named nodes."""
    named: set[str] = set()
    for spec in scenario.jobs:
        named.update(spec.nodes or ())
    for fault in scenario.faults:
        if isinstance(fault, NodeDown | PortDegraded | LinkDown):
            named.add(fault.node)
    highest = -1
    for node in sorted(named):
        match = _NODE_NUMBER.match(node)
        if match is None:
            message = f"scenario names node {node!r}: without --topology nodes are node-NNN"
            raise ScenarioError(message)
        highest = max(highest, int(match.group(1)))
    listed = {node for spec in scenario.jobs for node in spec.nodes or ()}
    auto = sum(_nodes_needed(spec) for spec in scenario.jobs if spec.nodes is None)
    count = max(highest + 1, len(listed) + auto, 1) + scenario.fabric.spare_nodes
    shape = Shape(
        nodes=count,
        spines=scenario.fabric.spines,
        nics=GPUS_PER_NODE,
        nodes_per_leaf=scenario.fabric.nodes_per_leaf,
        gpus=GPUS_PER_NODE,
    )
    try:
        return generate(shape)
    except TopologyError as error:
        message = f"cannot generate a topology for the scenario: {error}"
        raise ScenarioError(message) from error


def _nodes_needed(spec: JobSpec) -> int:
    return math.ceil(spec.ranks / GPUS_PER_NODE)


def _place(
    scenario: Scenario, topology: Topology, nodes: Mapping[str, TopologyNode]
) -> list[tuple[str, ...]]:
    """Each job's nodes: as listed, or the next free nodes in topology order."""
    taken: dict[str, str] = {}
    for index, spec in enumerate(scenario.jobs):
        if spec.nodes is None:
            continue
        where = f"jobs[{index}].nodes"
        if len(spec.nodes) != _nodes_needed(spec):
            message = (
                f"{where}: {spec.ranks} ranks need {_nodes_needed(spec)} nodes "
                f"of {GPUS_PER_NODE} GPUs, {len(spec.nodes)} listed"
            )
            raise ScenarioError(message)
        for node in spec.nodes:
            if node not in nodes:
                message = f"{where}: unknown node {node!r}"
                raise ScenarioError(message)
            if node in taken:
                message = f"{where}: node {node!r} is also used by {taken[node]}"
                raise ScenarioError(message)
            taken[node] = spec.id
    free = (node.id for node in topology.nodes if node.id not in taken)
    placements: list[tuple[str, ...]] = []
    for index, spec in enumerate(scenario.jobs):
        if spec.nodes is not None:
            chosen = spec.nodes
        else:
            chosen = tuple(node for _, node in zip(range(_nodes_needed(spec)), free, strict=False))
            if len(chosen) < _nodes_needed(spec):
                message = (
                    f"jobs[{index}]: {spec.ranks} ranks need {_nodes_needed(spec)} free nodes, "
                    f"the topology has {len(chosen)} left"
                )
                raise ScenarioError(message)
        if "tp" in spec.comms and spec.ranks % GPUS_PER_NODE:
            message = f"jobs[{index}].comms: tp needs ranks in multiples of {GPUS_PER_NODE}"
            raise ScenarioError(message)
        for position, node_id in enumerate(chosen):
            host = nodes[node_id]
            used = min(GPUS_PER_NODE, spec.ranks - position * GPUS_PER_NODE)
            ports = {port.id for port in host.ports}
            if host.gpus < used:
                message = f"jobs[{index}]: node {node_id} has {host.gpus} GPUs, {used} needed"
                raise ScenarioError(message)
            missing = [local_port(g) for g in range(used) if local_port(g) not in ports]
            if missing:
                message = f"jobs[{index}]: node {node_id} has no port {missing[0]}"
                raise ScenarioError(message)
        placements.append(chosen)
    return placements


@dataclass(frozen=True, slots=True)
class _Ends:
    """Where ring connection ``src -> dst`` of a communicator starts and ends."""

    src: int
    src_port: str | None  # None: NVLink inside a node
    dst: int
    dst_port: str | None
    sport: int


@dataclass(frozen=True, slots=True)
class _Ring:
    """A communicator that crosses NIC ports, before routing: its group and ring ends."""

    group: Group
    ends: tuple[_Ends, ...]
    flow_prefix: str  # ``job/comm/``: a connection's flow id is this and ``src->dst``
    pairs: tuple[_Ends, ...] | None = None  # an all-to-all's pairs (see the module doc)


def _rings(spec: JobSpec, nodes: tuple[str, ...]) -> dict[str, _Ring | None]:
    """Per group name, its connections (`topology.traffic`; None: inside one node)."""
    found: dict[str, _Ring | None] = {}
    for group in groups(spec):
        members = group.members
        where = [m // GPUS_PER_NODE for m in members]
        if group.kind == "tp" or not network_hops(where):
            found[group.name] = None  # NVLink inside one node, no NIC port involved
            continue
        hops = sorted(ring_hops(where))  # by sender: ``ring[k].src == k``
        ends = [_ends(spec, group, nodes, where, k, nxt) for k, nxt in hops]
        pairs = None
        if group.kind == "ep" and len(members) > 2:
            # A ring hop and the pair of the same two members are one connection.
            ring = {(end.src, end.dst): end for end in ends}
            pairs = tuple(
                ring.get((i, j)) or _ends(spec, group, nodes, where, i, j, f"{i}->{j}")
                for i, j in all_pairs(where)
            )
        prefix = f"{spec.id}/{_ident(spec.id, group)}/"
        found[group.name] = _Ring(group, tuple(ends), prefix, pairs)
    return found


def _ends(
    spec: JobSpec,
    group: Group,
    nodes: tuple[str, ...],
    where: list[int],
    k: int,
    nxt: int,
    key: str | None = None,
) -> _Ends:
    """Connection ``k -> nxt`` of a group: its ports (None inside a node) and source port."""
    members = group.members
    a, b = members[k], members[nxt]
    src = dst = None
    if where[k] != where[nxt]:
        src = f"{nodes[a // GPUS_PER_NODE]}/{local_port(a % GPUS_PER_NODE)}"
        dst = f"{nodes[b // GPUS_PER_NODE]}/{local_port(b % GPUS_PER_NODE)}"
    # The RDMA stack picks a source port per queue pair: a stable hash stands in (a ring
    # hop's key is its sender, as it always was).
    name = f"{spec.id}/{group.name}/{k if key is None else key}".encode()
    sport = SPORT_MIN + zlib.crc32(name) % (SPORT_MAX - SPORT_MIN + 1)
    return _Ends(k, src, nxt, dst, sport)


def _ident(job: str, group: Group) -> str:
    """A communicator's id: its hash, or a pipeline pair's ``<group>:p2p:<lo>-<hi>``."""
    if group.parent is None:
        return comm_id(job, group.name)
    lo, hi = sorted(group.members)
    return f"{comm_id(job, group.parent)}:p2p:{lo}-{hi}"


Route = tuple[str | None, tuple[tuple[str, int], ...]]  # spine, (fabric link, direction)
RouteKey = tuple[str, str, int, int]  # job, group name, connection src -> dst


def _routes(
    fabric: Fabric, rings: dict[str, dict[str, _Ring | None]], planned: Mapping[str, str]
) -> tuple[dict[RouteKey, Route], Counter[tuple[str, str, int]]]:
    """The path of every ring connection (``planned`` spines first, else ECMP), and how many
    connections of one kind (those that carry traffic at the same time) share each link."""
    ecmp = Ecmp(fabric, Crc32Hash())
    routes: dict[RouteKey, Route] = {}
    shares: Counter[tuple[str, str, int]] = Counter()
    for job, job_rings in rings.items():
        for name, ring in job_rings.items():
            if ring is None:
                continue
            # An all-to-all's bytes go over its pairs: they, not its ring, share the links.
            for ends, traffic in ((ring.ends, ring.pairs is None), (ring.pairs or (), True)):
                for end in ends:
                    key = (job, name, end.src, end.dst)
                    route = routes.get(key)
                    if route is None:
                        route = routes[key] = _route(fabric, ecmp, ring, end, planned, job)
                    if traffic:
                        shares.update((ring.group.kind, link, d) for link, d in route[1])
    return routes, shares


def _route(
    fabric: Fabric, ecmp: Ecmp, ring: _Ring, end: _Ends, planned: Mapping[str, str], job: str
) -> Route:
    """One connection's spine and fabric links (none over NVLink or within one leaf)."""
    if end.src_port is None or end.dst_port is None:
        return (None, ())  # NVLink
    a, b = fabric.index_of(end.src_port), fabric.index_of(end.dst_port)
    leaf_a, leaf_b = fabric.port_leaf[a], fabric.port_leaf[b]
    if leaf_a == leaf_b:
        return (None, ())
    flow = f"{ring.flow_prefix}{end.src}->{end.dst}"
    via = planned.get(flow)
    spine = ecmp.choose(a, b, end.sport) if via is None else _planned(fabric, a, b, via)
    if spine < 0:
        message = f"job {job}: {fabric.unreachable(a, b)}"
        raise ScenarioError(message)
    up = fabric.link_ids[fabric.uplinks[leaf_a][spine]]
    down = fabric.link_ids[fabric.uplinks[leaf_b][spine]]
    return (fabric.spines[spine], ((up, 0), (down, 1)))


def _planned(fabric: Fabric, a: int, b: int, via: str) -> int:
    """The spine a plan gives the connection between two ports (-1: no path through it)."""
    spine = fabric.spine_index.get(via, -1)
    if spine not in fabric.usable_spines(fabric.port_leaf[a], fabric.port_leaf[b]):
        return -1
    return spine


def _job(
    spec: JobSpec,
    nodes: tuple[str, ...],
    rings: dict[str, _Ring | None],
    routes: Mapping[RouteKey, Route],
    shares: Counter[tuple[str, str, int]],
    speeds: Mapping[str, float],
) -> PlacedJob:
    comms = []
    for group in groups(spec):
        ident = _ident(spec.id, group)
        ring = rings[group.name]
        ring_conns = pairs = None
        if ring is not None:
            key = (spec.id, group.name)
            ring_conns = _conns(ring.ends, key, routes, shares, speeds, group.kind)
            if ring.pairs is not None:
                pairs = _conns(ring.pairs, key, routes, shares, speeds, group.kind, shared=True)
        prev = [0] * len(group.members)
        for conn in ring_conns or ():
            prev[conn.dst] = conn.src
        comms.append(
            Comm(ident, group.name, group.kind, group.members, ring_conns, tuple(prev), pairs)
        )
    return PlacedJob(spec, nodes, tuple(comms))


def _conns(
    ends: tuple[_Ends, ...],
    key: tuple[str, str],
    routes: Mapping[RouteKey, Route],
    shares: Counter[tuple[str, str, int]],
    speeds: Mapping[str, float],
    kind: str,
    shared: bool = False,
) -> tuple[Conn, ...]:
    """The connections of these ends, each at its ports' speed (``shared``: a port's share
    among the connections leaving and entering it) and its fair share of each fabric link."""
    network = [end for end in ends if end.src_port is not None and end.dst_port is not None]
    share = dict(
        zip(
            ((end.src, end.dst) for end in network),
            shared_gbps(
                [(end.src_port, end.dst_port) for end in network],
                [speeds[str(end.src_port)] for end in network],
                [speeds[str(end.dst_port)] for end in network],
            )
            if shared
            else [min(speeds[str(end.src_port)], speeds[str(end.dst_port)]) for end in network],
            strict=True,
        )
    )
    conns = []
    for end in ends:
        via, hops = routes[(*key, end.src, end.dst)]
        gbps = share.get((end.src, end.dst), NVLINK_GBPS)
        for link, direction in hops:
            # Flows that share a directed link share its capacity (ECMP collisions).
            gbps = min(gbps, speeds[link] / shares[(kind, link, direction)])
        links = tuple(link for link, _ in hops)
        conns.append(
            Conn(end.src, end.dst, end.src_port, end.dst_port, via, links, gbps, end.sport)
        )
    return tuple(conns)


def _check_faults(scenario: Scenario, cluster: Cluster) -> None:
    for index, fault in enumerate(scenario.faults):
        where = f"faults[{index}]"
        if isinstance(fault, NodeDown | PortDegraded | LinkDown):
            node = cluster.nodes.get(fault.node)
            if node is None:
                message = f"{where}.node: unknown node {fault.node!r}"
                raise ScenarioError(message)
            if isinstance(fault, PortDegraded | LinkDown) and fault.port not in {
                port.id for port in node.ports
            }:
                message = f"{where}.port: node {fault.node} has no port {fault.port!r}"
                raise ScenarioError(message)
        elif (
            isinstance(fault, FabricLinkDegraded | FabricLinkDown)
            and fault.link not in cluster.fabric_links
        ):
            message = f"{where}.link: unknown fabric link {fault.link!r}"
            raise ScenarioError(message)

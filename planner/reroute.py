"""Reroute (pure): jobs' placements and a link diagnosis in, v1 route messages per node out.

Traffic model: `topology.traffic`, the one the simulator uses too (jobs running or restarting:
a restart's placement is where the job comes back). A job's traffic is its communicators'
hops between two nodes (data-parallel rings laid out rail by rail, a pipeline pair's two
directions, an expert group's all-to-all as every ordered pair; hops inside a node are
NVLink), each from its rank's NIC port to the receiving rank's port: flow ``job/comm/i->j``
in communicator ranks, the ids the detectors and the simulator use. Each flow carries its
communicator's kind as its phase (``dp``, ``pp``, ``ep``, ``world``; `traffic.comm_kinds`):
phases do not share time, so the planner plans each apart, and a port's flows in one phase
share its line rate (a ring hop gets it whole, an all-to-all pair its share). Hops that
cannot be placed (a rank without a place or a port, a port the topology does not have, ports
in different planes) are listed in ``skipped``, not planned.

Failure model. A link_down or link_degraded diagnosis names its suspects: a fabric link
(``leaf-0a~spine-3``), a port (``node-001/mlx5_3:1``: its cable), or a switch (every link of
a spine; a leaf's uplinks and its ports' cables). A degraded link is avoided like a down one.
A flow whose own cable is down has no path in its plane; it fails over to the sibling ports
of its NIC (``mlx5_3:1`` -> ``mlx5_3:2``, on the other plane) at both ends when both exist
and are up, else it is ``stranded``. A resolved diagnosis gives its links back.

The plan in force is a `CurrentPlan`; the new one comes from `choice.replan_choice` (by
default only the flows that crossed the failed links move). Every node with a changed path
(or source port) gets a v1 route message holding all of its paths, so a node can apply the
message as its whole plan.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from planner import PlannerError
from planner.choice import ReplanMode, Strategy, misses, replan_choice
from planner.core import RoutedPath, phase_bounds, plan
from schemas.files import Flow, Flows, Plan, PlanPath
from schemas.messages import Diagnosis, Job, Route, RoutePath
from topology import TopologyError
from topology.ecmp import SwitchHash
from topology.model import Fabric
from topology.traffic import comm_kinds, flow_id, kind_hops, shared_gbps

REROUTE_CLASSES = frozenset({"link_down", "link_degraded"})
LINK_SUSPECTS = frozenset({"link", "port", "switch"})


class RerouteError(PlannerError):
    """A diagnosis that names no link to route around, or a reroute that cannot be planned."""


@dataclass(frozen=True, slots=True)
class CurrentPlan:
    """The plan in force: its id, its paths, the links it avoids, what made it."""

    id: str
    plan: Plan
    down: tuple[str, ...]
    ts_ns: int
    diagnosis: str | None = None


@dataclass(frozen=True, slots=True)
class JobFlows:
    """The network flows of the running jobs, and the hops left out (one line each)."""

    flows: tuple[Flow, ...]
    skipped: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Reroute:
    """The outcome of one reroute: the new plan in force and the messages to publish."""

    current: CurrentPlan
    strategy: Strategy
    moved: tuple[str, ...]  # flows whose path changed (new flows included)
    changed: tuple[str, ...]  # flows whose path or source port changed: what nodes must apply
    stranded: tuple[str, ...]  # one line per flow with no path left
    skipped: tuple[str, ...]  # one line per hop that is not a network flow we can place
    failed_over: tuple[str, ...]  # flows moved to their NICs' sibling ports
    before_max_util: float | None  # the previous plan's max_util (None: no plan was in force)
    after_max_util: float
    bound: float
    routes: tuple[Route, ...]
    # Per named phase, its lower bound, and where the new plan is above it by how much
    # (max_util over bound, minus 1): what the replan misses of the per-phase objective.
    phase_bounds: Mapping[str, float] = field(default_factory=dict)
    misses: Mapping[str, float] = field(default_factory=dict)
    extra_moves: int = 0  # flows moved that the failure did not force (`choice`)


def job_flows(fabric: Fabric, jobs: Iterable[Job]) -> JobFlows:
    """The network flows of every running job (see the module doc), in job and comm order."""
    latest: dict[str, Job] = {}
    for job in jobs:
        if job.job not in latest or job.ts_ns >= latest[job.job].ts_ns:
            latest[job.job] = job
    pending: list[tuple[str, str, str, str]] = []  # flow, src, dst, phase
    skipped: list[str] = []
    for name in sorted(latest):
        job = latest[name]
        if job.state == "stopped":
            continue  # a restarting job's placement is where it is coming back: planned
        places = {place.rank: place for place in job.ranks}
        node_of = {place.rank: place.node for place in job.ranks}
        kinds = comm_kinds(job.comms, len(job.ranks) or None, node_of)
        for comm, members in sorted(job.comms.items()):
            # A rank without a place is a node of its own: its hops are named, not planned.
            nodes = [places[rank].node if rank in places else f"?{rank}" for rank in members]
            for i, j in kind_hops(kinds[comm], nodes):
                flow = flow_id(name, comm, i, j)
                a, b = places.get(members[i]), places.get(members[j])
                if a is None or b is None:
                    missing = members[i] if a is None else members[j]
                    skipped.append(f"{flow}: rank {missing} has no place")
                    continue
                if a.port is None or b.port is None:
                    missing = members[i] if a.port is None else members[j]
                    skipped.append(f"{flow}: rank {missing} has no port")
                    continue
                src, dst = f"{a.node}/{a.port}", f"{b.node}/{b.port}"
                unknown = next((p for p in (src, dst) if p not in fabric.ports), None)
                if unknown is not None:
                    skipped.append(f"{flow}: unknown port {unknown}")
                    continue
                if fabric.plane_of(src) != fabric.plane_of(dst):
                    leaf = fabric.cut_off(src) or fabric.cut_off(dst)
                    skipped.append(
                        f"{flow}: {leaf} has no uplink to a spine"
                        if leaf is not None
                        else f"{flow}: {src} and {dst} are in different planes"
                    )
                    continue
                pending.append((flow, src, dst, kinds[comm]))
    # A port's flows in one phase share its line rate (`traffic.shared_gbps`).
    demand = shared_gbps(
        [((phase, src), (phase, dst)) for _, src, dst, phase in pending],
        [fabric.ports[src].gbps for _, src, _, _ in pending],
        [fabric.ports[dst].gbps for _, _, dst, _ in pending],
    )
    flows = [
        Flow(id=flow, src=src, dst=dst, gbps=gbps, phase=phase)
        for (flow, src, dst, phase), gbps in zip(pending, demand, strict=True)
    ]
    return JobFlows(tuple(flows), tuple(skipped))


def failed_links(fabric: Fabric, diagnosis: Diagnosis, min_score: float = 0.0) -> tuple[str, ...]:
    """The link ids a link diagnosis names (suspects of at least ``min_score``), in order.

    Raises `RerouteError` for another class or when no suspect is a known link, port or switch.
    """
    if diagnosis.class_ not in REROUTE_CLASSES:
        error = f"diagnosis {diagnosis.id} is {diagnosis.class_}, not a link finding"
        raise RerouteError(error)
    found: list[str] = []
    for suspect in diagnosis.suspects:
        if suspect.type not in LINK_SUSPECTS or suspect.score < min_score:
            continue
        for link in _links_of(fabric, suspect.type, suspect.id):
            if link not in found:
                found.append(link)
    if not found:
        named = ", ".join(f"{s.type} {s.id}" for s in diagnosis.suspects) or "no suspects"
        error = f"diagnosis {diagnosis.id} names no link of the topology ({named})"
        raise RerouteError(error)
    return tuple(found)


def _links_of(fabric: Fabric, kind: str, name: str) -> list[str]:
    if kind in ("link", "port"):
        return [name] if name in fabric.link_index else []
    if name in fabric.spine_index:
        spine = fabric.spine_index[name]
        return [fabric.link_ids[x] for x, s in enumerate(fabric.link_spine) if s == spine]
    if name in fabric.leaf_index:
        leaf = fabric.leaf_index[name]
        return [fabric.link_ids[x] for x, lf in enumerate(fabric.link_leaf) if lf == leaf]
    return []


def plan_id(previous: str | None, diagnosis: str, state: str, down: Iterable[str]) -> str:
    """A deterministic plan id: the same reroute retried gets the same id."""
    text = "|".join((previous or "-", diagnosis, state, *sorted(down)))
    return "p-" + hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def reroute(
    fabric: Fabric,
    jobs: Iterable[Job],
    current: CurrentPlan | None,
    diagnosis: Diagnosis,
    ts_ns: int,
    hash_model: SwitchHash | None = None,
    mode: ReplanMode = "incremental",
    min_score: float = 0.0,
) -> Reroute:
    """Replan the running jobs' flows around (or back onto) the diagnosis's links.

    Without a plan in force every flow is planned afresh (the fabric ran ECMP: no path is
    known to keep). Raises `RerouteError` (see `failed_links`).
    """
    links = failed_links(fabric, diagnosis, min_score)
    # Links of an older topology are forgotten: the fabric no longer has them.
    before = {x for x in current.down if x in fabric.link_index} if current else set()
    down = before - set(links) if diagnosis.state == "resolved" else before | set(links)
    ordered = tuple(sorted(down))
    traffic = job_flows(fabric, jobs)
    routable, failed_over, stranded = route_around_cables(fabric, traffic.flows, down)
    # job_flows' ids are unique and its hops join two nodes, as do their sibling ports: a
    # valid flows file, built without validating 16k flows again.
    flows = Flows.model_construct(v=1, kind="flows", flows=tuple(routable), down=())
    new_id = plan_id(current.id if current else None, diagnosis.id, diagnosis.state, ordered)
    strategy: Strategy = "full"
    extra = 0
    try:
        if current is None:
            result = plan(fabric, flows, ordered, hash_model)
            moved = tuple(path.flow for path in result.paths)
            bounds = phase_bounds(fabric, flows, ordered)
            utils: dict[str | None, float] = {None: result.max_util}
            if result.phases:
                utils = {phase: util for phase, util in result.phases.items()}
        else:
            chosen = replan_choice(fabric, current.plan, flows, ordered, hash_model, mode)
            result, strategy, moved = chosen.plan, chosen.strategy, chosen.moved
            bounds, utils = dict(chosen.bounds), dict(chosen.utils)
            extra = chosen.extra_moves
    except TopologyError as error:
        raise RerouteError(str(error)) from error
    named = {phase: bound for phase, bound in bounds.items() if phase is not None}
    missed = {phase: by for phase, by in misses(utils, bounds).items() if phase is not None}
    changed = _changed(current.plan if current else None, result)
    routes = route_messages(result, {f.id: f for f in routable}, changed, new_id, ts_ns)
    return Reroute(
        current=CurrentPlan(new_id, result, ordered, ts_ns, diagnosis.id),
        strategy=strategy,
        moved=moved,
        changed=changed,
        stranded=tuple(stranded),
        skipped=traffic.skipped,
        failed_over=tuple(failed_over),
        before_max_util=current.plan.max_util if current is not None else None,
        after_max_util=result.max_util,
        bound=max(bounds.values(), default=0.0),
        routes=routes,
        phase_bounds=named,
        misses=missed,
        extra_moves=extra,
    )


def route_around_cables(
    fabric: Fabric, flows: tuple[Flow, ...], down: set[str]
) -> tuple[list[Flow], list[str], list[str]]:
    """Flows with a usable path; those failed over to sibling ports; those stranded.

    The flows with a path keep their ids, and their two ends stay distinct ports: flows of a
    valid flows file make a valid flows file (`Flows.model_construct` may take them).

    Only flows at a down cable or on a leaf with a down uplink are looked at closely: the
    others are kept as they are (the same objects, in order), a set lookup each.
    """
    links_down = frozenset(fabric.link_indices(sorted(down)))
    cables = len(fabric.port_ids)
    # Only pairs of leaves with a down uplink need their spines checked, once a pair.
    touched = {fabric.link_leaf[link] for link in links_down if link >= cables}
    cut = {fabric.port_ids[link] for link in links_down if link < cables}
    if not cut and not touched:
        return list(flows), [], []
    near = cut | {port for leaf in touched for port in _leaf_ports(fabric)[leaf]}
    reachable: dict[tuple[int, int], bool] = {}
    routable: list[Flow] = []
    failed_over: list[str] = []
    stranded: list[str] = []
    for flow in flows:
        src, dst = flow.src, flow.dst
        if src not in near and dst not in near:
            routable.append(flow)
            continue
        if src in cut or dst in cut:
            pair = _siblings(fabric, _nic_ports(fabric), src, dst, down)
            if pair is None:
                cable = src if src in down else dst
                stranded.append(f"{flow.id}: the cable of {cable} is down, no sibling port")
                continue
            src, dst = pair
            failed_over.append(flow.id)
        la = fabric.port_leaf[fabric.port_index[src]]
        lb = fabric.port_leaf[fabric.port_index[dst]]
        if la != lb and (la in touched or lb in touched):
            ok = reachable.get((la, lb))
            if ok is None:
                ok = reachable[(la, lb)] = bool(fabric.usable_spines(la, lb, links_down))
            if not ok:
                stranded.append(f"{flow.id}: every path from {src} to {dst} crosses a down link")
                continue
        routable.append(
            flow
            if (src, dst) == (flow.src, flow.dst)
            else Flow(id=flow.id, src=src, dst=dst, gbps=flow.gbps, phase=flow.phase)
        )
    return routable, failed_over, stranded


def _siblings(
    fabric: Fabric, nics: Mapping[tuple[str, str], list[str]], src: str, dst: str, down: set[str]
) -> tuple[str, str] | None:
    """Sibling ports of both ends' NICs (same device, another port) in one common plane."""
    for a in _same_nic(nics, src, down):
        plane = fabric.plane_of(a)
        for b in _same_nic(nics, dst, down):
            if b != a and fabric.plane_of(b) == plane:
                return a, b
    return None


# Port maps of the last few fabrics, by identity (the fabric held, so its id stays its own).
_PORT_MAPS: OrderedDict[int, tuple[Fabric, PortMaps]] = OrderedDict()
_KEEP_MAPS = 4


@dataclass(frozen=True, slots=True)
class PortMaps:
    """A fabric's ports by NIC and by leaf, made once per fabric, not once per reroute."""

    nics: dict[tuple[str, str], list[str]]
    leaves: dict[int, frozenset[str]]


def _port_maps(fabric: Fabric) -> PortMaps:
    known = _PORT_MAPS.get(id(fabric))
    if known is not None and known[0] is fabric:
        _PORT_MAPS.move_to_end(id(fabric))
        return known[1]
    nics: dict[tuple[str, str], list[str]] = {}
    leaves: dict[int, set[str]] = {}
    for port, info in fabric.ports.items():
        device = port.partition("/")[2].rpartition(":")[0]
        if device:
            nics.setdefault((info.node, device), []).append(port)
        leaves.setdefault(fabric.port_leaf[fabric.port_index[port]], set()).add(port)
    maps = PortMaps(nics, {leaf: frozenset(ports) for leaf, ports in leaves.items()})
    _PORT_MAPS[id(fabric)] = (fabric, maps)
    while len(_PORT_MAPS) > _KEEP_MAPS:
        _PORT_MAPS.popitem(last=False)
    return maps


def _nic_ports(fabric: Fabric) -> dict[tuple[str, str], list[str]]:
    """The ports of every NIC: (node, device) -> global port ids (``mlx5_3:1`` is mlx5_3's)."""
    return _port_maps(fabric).nics


def _leaf_ports(fabric: Fabric) -> dict[int, frozenset[str]]:
    """The ports cabled to each leaf (by leaf number)."""
    return _port_maps(fabric).leaves


def _same_nic(nics: Mapping[tuple[str, str], list[str]], port: str, down: set[str]) -> list[str]:
    """The ports of this port's NIC whose cables are up, the port itself first."""
    node, _, local = port.partition("/")
    others = [other for other in nics.get((node, local.rpartition(":")[0]), ()) if other != port]
    return [p for p in (port, *others) if p not in down]


def link_utilization(
    fabric: Fabric,
    result: Plan,
    demand: Mapping[str, float],
    phase: Mapping[str, str | None] | None = None,
) -> dict[str, float]:
    """Each loaded link's utilisation under a plan: the busier direction's demand over the
    link's capacity, in the busiest phase (``phase``: flow -> its phase; flows of different
    phases do not share time; without it every flow is in one phase). A path runs up its
    first half (source cable, leaf to spine) and down its second (spine to leaf, destination
    cable); flows without a demand count nothing."""
    load: dict[tuple[str, int, str | None], float] = {}
    phases = phase or {}
    for path in result.paths:
        gbps = demand.get(path.flow, 0.0)
        if gbps <= 0:
            continue
        half = (len(path.links) + 1) // 2
        name = phases.get(path.flow)
        for position, link in enumerate(path.links):
            key = (link, 0 if position < half else 1, name)
            load[key] = load.get(key, 0.0) + gbps
    found: dict[str, float] = {}
    for (link, _, _), gbps in load.items():
        if link not in fabric.link_index:
            continue
        util = gbps / fabric.capacity(link)
        if util > found.get(link, 0.0):
            found[link] = util
    return found


def _changed(previous: Plan | None, result: Plan) -> tuple[str, ...]:
    """Flows whose links or source port differ from the previous plan's (new ones too)."""
    before: Mapping[str, PlanPath] = {p.flow: p for p in previous.paths} if previous else {}
    out = []
    for path in result.paths:
        old = before.get(path.flow)
        if old is None or old.links != path.links or _sport(old) != _sport(path):
            out.append(path.flow)
    return tuple(out)


def _sport(path: PlanPath) -> int | None:
    # A type check, not getattr: a missing pydantic attribute is a slow AttributeError.
    return path.sport if isinstance(path, RoutedPath) else None


def route_messages(
    result: Plan,
    flows: Mapping[str, Flow],
    changed: Iterable[str],
    plan: str,
    ts_ns: int,
) -> tuple[Route, ...]:
    """A v1 route per node that sends a changed flow, holding all of that node's paths."""
    nodes = {flows[flow].src.partition("/")[0] for flow in changed}
    paths: dict[str, list[RoutePath]] = {}
    for path in result.paths:
        node, _, port = flows[path.flow].src.partition("/")
        if node in nodes:
            paths.setdefault(node, []).append(
                RoutePath(flow=path.flow, port=port, via=path.via, sport=_sport(path))
            )
    return tuple(
        Route(v=1, kind="route", node=node, ts_ns=ts_ns, plan=plan, paths=tuple(paths[node]))
        for node in sorted(paths)
    )


def node_routes(result: Plan, nodes: Iterable[str], plan: str, ts_ns: int) -> tuple[Route, ...]:
    """A v1 route for each of ``nodes`` with all of its paths in ``result`` (maybe none).

    A path leaves from its first link, the source port's cable. This tells a node again, from
    the plan now made, what it was told from a plan that never came into force.
    """
    paths: dict[str, list[RoutePath]] = {node: [] for node in sorted(set(nodes))}
    for path in result.paths:
        node, _, port = path.links[0].partition("/")
        if node in paths:
            paths[node].append(
                RoutePath(flow=path.flow, port=port, via=path.via, sport=_sport(path))
            )
    return tuple(
        Route(v=1, kind="route", node=node, ts_ns=ts_ns, plan=plan, paths=tuple(hops))
        for node, hops in paths.items()
    )

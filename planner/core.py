"""C4P: a path per flow minimising the largest link utilisation; incremental replanning.

Per plane, equal-demand inter-leaf flows are first edge-coloured (`colouring`): with at least
as many spines as flows at any leaf that is collision-free, and in general it puts at most
``ceil(degree / usable spines)`` flows on any uplink or downlink, which meets the lower bound;
a leaf's down or missing links are colours it must avoid. Where that does not reach the bound
(unequal demands, unequal capacities, a down link the colouring could not avoid) the
least-loaded heuristic is tried as well, the better kept, then repaired by local moves
(`balance`). Flows within one leaf have a single path and are only charged to their cables.
A phased flows file (`phases`) is planned phase by phase: phases do not share time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import orjson

from planner.balance import TOLERANCE, Assignment, least_loaded, repair
from planner.bound import problem_bound
from planner.colouring import colour_balanced
from planner.paths import PathMaker
from planner.paths import RoutedPath as RoutedPath
from planner.phases import join, previous_by_phase, split
from planner.problem import Problem, build_problem
from planner.standing import plan_state, remember, replan_fast
from schemas.files import Flows, Plan, PlanPath
from topology.ecmp import SwitchHash
from topology.model import Fabric

# One phase's plan and what `standing` keeps of it: its problem and each flow's spine.
Phased = tuple[Plan, Problem, Sequence[int]]


def plan(
    fabric: Fabric, flows: Flows, down: Iterable[str] = (), hash_model: SwitchHash | None = None
) -> Plan:
    """The plan of ``flows`` avoiding ``down`` and the flows file's own ``down`` links.

    With a hash model every path is a `RoutedPath` carrying its source port. Raises
    `topology.TopologyError` subclasses for unknown ports or links and unreachable flows.
    """
    down = tuple(down)
    parts = split(flows)
    if parts is None:
        only = _plan_one(fabric, flows, down, hash_model)
        return _kept(fabric, flows, hash_model, {None: only}, only[0])
    plans = {phase: _plan_one(fabric, part, down, hash_model) for phase, part in parts.items()}
    return _kept(fabric, flows, hash_model, plans, join(flows, {k: v[0] for k, v in plans.items()}))


def _plan_one(
    fabric: Fabric, flows: Flows, down: Iterable[str], hash_model: SwitchHash | None
) -> Phased:
    """The plan of flows that all run at the same time (one phase)."""
    problem = build_problem(fabric, flows, down)
    state = solve(problem)
    return build_plan(problem, state, hash_model, {}), problem, state.spine


def _kept(
    fabric: Fabric,
    flows: Flows,
    hash_model: SwitchHash | None,
    phases: dict[str | None, Phased],
    result: Plan,
) -> Plan:
    """The plan, its standing state kept for the replans that may follow (`standing`)."""
    down = next(iter(phases.values()))[1].down if phases else frozenset[int]()
    parts = {phase: (problem, spine, one.paths) for phase, (one, problem, spine) in phases.items()}
    remember(plan_state(fabric, result, flows, down, hash_model, parts))
    return result


def lower_bound(fabric: Fabric, flows: Flows, down: Iterable[str] = ()) -> float:
    """No plan of these flows has a smaller ``max_util`` (see `bound`); per phase, the largest."""
    return max(phase_bounds(fabric, flows, down).values(), default=0.0)


def phase_bounds(fabric: Fabric, flows: Flows, down: Iterable[str] = ()) -> dict[str | None, float]:
    """Each phase's lower bound (None: the unnamed phase, a file without phases)."""
    parts = split(flows)
    if parts is None:
        return {None: problem_bound(build_problem(fabric, flows, down))}
    return {
        phase: problem_bound(build_problem(fabric, part, down)) for phase, part in parts.items()
    }


def replan(
    fabric: Fabric,
    previous: Plan,
    flows: Flows,
    down: Iterable[str] = (),
    hash_model: SwitchHash | None = None,
) -> Plan:
    """The plan after links went down or degraded: only flows that crossed them move.

    A degraded link belongs in ``down``: it is to be avoided, like a failed one. A flow keeps
    its previous path when that path avoids every down link; flows that cross one, and flows
    the previous plan does not have, are placed least-loaded and repaired among themselves.
    The previous path objects are reused, so a small change is cheap on a large plan; after
    a plan made here, only what the failure affects is touched (`standing`). A phased file
    is replanned phase by phase.
    """
    down = tuple(down)
    fast = replan_fast(fabric, previous, flows, down, hash_model)
    if fast is not None:
        return fast.plan
    parts = split(flows)
    if parts is None:
        only = _replan_one(fabric, previous, flows, down, hash_model)
        return _kept(fabric, flows, hash_model, {None: only}, only[0])
    before = previous_by_phase(previous, flows)
    plans = {
        phase: _replan_one(fabric, before[phase], part, down, hash_model)
        for phase, part in parts.items()
    }
    return _kept(fabric, flows, hash_model, plans, join(flows, {k: v[0] for k, v in plans.items()}))


def _replan_one(
    fabric: Fabric,
    previous: Plan,
    flows: Flows,
    down: Iterable[str],
    hash_model: SwitchHash | None,
) -> Phased:
    """The incremental replan of flows that all run at the same time (one phase)."""
    problem = build_problem(fabric, flows, down)
    state, kept = incremental(problem, previous)
    return build_plan(problem, state, hash_model, kept), problem, state.spine


def incremental(problem: Problem, previous: Plan) -> tuple[Assignment, dict[str, PlanPath]]:
    """The assignment of `replan`, and the previous paths of the flows that stay."""
    state = Assignment(problem)
    kept, movable = _keep(problem, state, previous)
    # Kept flows stay put, so nothing goes below their maximum; and only links the moved
    # flows load can exceed it, so the repair needs to know of the moved flows alone.
    target = state.max_util()
    least_loaded(state, movable)
    repair(state, movable, target)
    return state, kept


def _keep(
    problem: Problem, state: Assignment, previous: Plan
) -> tuple[dict[str, PlanPath], list[int]]:
    """Place every flow whose previous path is still usable; the others are to move."""
    fabric = problem.fabric
    before = {path.flow: path for path in previous.paths}
    spine_index, port_ids, uplinks, down = (
        fabric.spine_index,
        fabric.port_ids,
        fabric.uplinks,
        problem.down,
    )
    load, spine = state.load, state.spine
    kept: dict[str, PlanPath] = {}
    movable: list[int] = []
    # One pass over every flow of a large plan: zipped columns and inlined placement.
    columns = zip(
        problem.ids,
        problem.src,
        problem.dst,
        problem.src_leaf,
        problem.dst_leaf,
        problem.gbps,
        problem.cands,
        strict=True,
    )
    for f, (flow, s, d, la, lb, g, spines) in enumerate(columns):
        path = before.get(flow)
        if path is None or path.links[0] != port_ids[s] or path.links[-1] != port_ids[d]:
            movable.append(f)
            continue
        via = path.via
        if via is None or not spines:
            if (via is None) == (not spines):
                kept[flow] = path
            else:
                movable.append(f)
            continue
        number = spine_index.get(via, -1)
        up, dn = uplinks[la].get(number), uplinks[lb].get(number)
        if up is None or dn is None or up in down or dn in down:
            movable.append(f)
            continue
        load[2 * up] += g
        load[2 * dn + 1] += g
        spine[f] = number
        kept[flow] = path
    return kept, movable


def moved_flows(previous: Plan, current: Plan) -> list[str]:
    """The flows whose path differs between two plans (new flows included), in plan order."""
    before = {path.flow: path.links for path in previous.paths}
    return [path.flow for path in current.paths if before.get(path.flow) != path.links]


def plan_json(result: Plan) -> bytes:
    """The plan as v1 JSON, with each `RoutedPath`'s ``sport`` key kept."""
    return orjson.dumps(result.model_dump(serialize_as_any=True))


def plan_from_json(data: bytes | str) -> Plan:
    """A plan written by `plan_json`, each path with a ``sport`` read back as a `RoutedPath`.

    Raises `pydantic.ValidationError` (a `ValueError`) when it is not a valid v1 plan.
    """
    raw = orjson.loads(data)
    if not isinstance(raw, dict) or not isinstance(raw.get("paths"), list):
        return Plan.model_validate(raw)  # let the model say what is wrong
    paths = [
        RoutedPath.model_validate(path)
        if isinstance(path, dict) and "sport" in path
        else PlanPath.model_validate(path)
        for path in raw["paths"]
    ]
    return Plan.model_validate({**raw, "paths": paths})


def solve(problem: Problem) -> Assignment:
    """The spine of every inter-leaf flow: colouring, least-loaded, repair; per plane."""
    state = Assignment(problem)
    # The fabric's own bound: busy cables (a port with several flows) leave the fabric
    # links below them free to be balanced, and a plan is judged by them too.
    target = problem_bound(problem, cables=False)
    fabric = problem.fabric
    by_plane: dict[int, list[int]] = {}
    for f in problem.inter_leaf():
        by_plane.setdefault(fabric.leaf_plane[problem.src_leaf[f]], []).append(f)
    for plane, flows in by_plane.items():
        _solve_plane(state, flows, fabric.plane_spines[plane], target)
    return state


def _solve_plane(state: Assignment, flows: list[int], spines: Sequence[int], target: float) -> None:
    p = state.problem
    demands = {p.gbps[f] for f in flows}
    if len(demands) == 1:
        _colour(state, flows, spines)
        if state.fabric_max(flows) <= target + TOLERANCE:
            return
        coloured = [state.spine[f] for f in flows]
        worst = state.fabric_max(flows)
        for f in flows:
            state.unplace(f)
        least_loaded(state, flows)
        if state.fabric_max(flows) > worst:
            for f, s in zip(flows, coloured, strict=True):
                state.unplace(f)
                state.place(f, s)
    else:
        least_loaded(state, flows)
    repair(state, flows, target)


def _colour(state: Assignment, flows: list[int], spines: Sequence[int]) -> None:
    """Edge-colour the plane's flows with its spines, a leaf's down or missing links being
    colours it must not see; flows left on a spine they cannot use are placed least-loaded."""
    p = state.problem
    uplinks, down = p.fabric.uplinks, p.down
    forbid: dict[int, set[int]] = {}
    for leaf in {p.src_leaf[f] for f in flows} | {p.dst_leaf[f] for f in flows}:
        own = uplinks[leaf]
        missing = {c for c, s in enumerate(spines) if own.get(s, -1) < 0 or own[s] in down}
        if missing:
            forbid[leaf] = missing
    colours = colour_balanced(
        [p.src_leaf[f] for f in flows],
        [p.dst_leaf[f] for f in flows],
        len(spines),
        forbid,
        forbid,
    )
    full, misfits = len(spines), []
    for f, c in zip(flows, colours, strict=True):
        s, usable = spines[c], p.cands[f]
        if len(usable) == full or s in usable:
            state.place(f, s)
        else:
            misfits.append(f)
    least_loaded(state, misfits)


def build_plan(
    problem: Problem,
    state: Assignment,
    hash_model: SwitchHash | None,
    kept: dict[str, PlanPath],
) -> Plan:
    """The v1 plan of an assignment; ``kept`` paths are reused as they are (same spine)."""
    maker = PathMaker(problem, hash_model)
    paths: list[PlanPath] = []
    for f, flow in enumerate(problem.ids):
        s = state.spine[f]
        old = kept.get(flow)
        paths.append(old if old is not None and maker.keeps(f, s, old) else maker.make(f, s))
    return Plan(v=1, kind="plan", paths=tuple(paths), max_util=state.max_util())

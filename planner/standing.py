"""The standing state of a plan: what a replan after one failure needs, kept between calls.

`replan` used to rebuild every phase's problem, walk every flow to find those that cross a
down link and rebuild every path: linear in the flows, about 60 ms at 16k. A plan made by
`plan` or `replan` leaves its state here (the last few plans, by identity): per phase the
problem, each flow's spine, the link loads, the paths, and the flows indexed by directed
link, port and leaf. A replan from that plan, of the same flows (a few of them failed over
to sibling ports) with more links down, then touches only what the failure affects: the
flows on the newly down links and the failed-over ones move, the loads of the links they
leave are summed again, and the other phases are taken as they are.

The result is the one the full replan gives, float for float: a link's load is always the
sum of its flows' demands in flow order (the order `core.incremental` adds them), the moved
flows are placed and repaired by the same functions in the same order, and kept paths are
reused on the same terms (`PathMaker.keeps`). Anything else (other flows, a link back up, a
cable down under a flow that did not fail over, an unreachable flow, another hash model) is
left to the full replan, which also says what is wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import truediv

from planner.balance import Assignment, least_loaded, repair
from planner.paths import PathMaker
from planner.problem import Problem
from schemas.files import Flow, Flows, Plan, PlanPath
from topology.ecmp import SwitchHash
from topology.model import Fabric

KEEP = 4  # plans whose state is kept: the plan in force, and a few tried beside it

Index = dict[int, frozenset[int]]


@dataclass(frozen=True, slots=True)
class PhaseState:
    """One phase of a plan. Never changed once made: a replan derives a new one."""

    problem: Problem
    spine: Sequence[int]
    load: Sequence[float]  # every link's load summed in flow order (see the module doc)
    util: float  # the largest of load / capacity
    paths: Sequence[PlanPath]  # per flow of the phase
    positions: Sequence[int]  # per flow of the phase, its place in the flows file
    on_link: Index  # directed fabric link -> flows crossing it
    on_src: Index  # port -> flows leaving it
    on_dst: Index  # port -> flows arriving at it
    on_leaf: Index  # leaf -> inter-leaf flows leaving or arriving at it


@dataclass(frozen=True, slots=True)
class PlanState:
    """A plan, the flows and down links it was made for, and its phases' states."""

    fabric: Fabric
    plan: Plan
    flows: tuple[Flow, ...]
    down: frozenset[int]
    hash_model: SwitchHash | None
    phases: dict[str | None, PhaseState]
    local: Sequence[int]  # per flow of the file, its index in its phase


@dataclass(frozen=True, slots=True)
class FastReplan:
    """A replan made from a standing state: the plan, its phases' problems, what moved."""

    plan: Plan
    problems: dict[str | None, Problem]
    utils: dict[str | None, float]  # each phase's max_util
    moved: tuple[str, ...]  # flows whose links changed, in plan order
    state: PlanState


_known: OrderedDict[int, PlanState] = OrderedDict()


def remember(state: PlanState) -> None:
    """Keep a plan's state for the replans that may follow it."""
    _known[id(state.plan)] = state
    _known.move_to_end(id(state.plan))
    while len(_known) > KEEP:
        _known.popitem(last=False)


def forget() -> None:
    """Drop every kept state: the next replan runs in full."""
    _known.clear()


def recall(plan: Plan) -> PlanState | None:
    """The state of a plan made here (by identity), if still kept."""
    state = _known.get(id(plan))
    if state is None or state.plan is not plan:
        return None
    _known.move_to_end(id(plan))  # the plan in force stays while replans are tried from it
    return state


def phase_positions(flows: Sequence[Flow]) -> tuple[dict[str | None, list[int]], list[int]]:
    """Per phase its flows' places in the file (in order), and each flow's index in its phase."""
    positions: dict[str | None, list[int]] = {}
    local = []
    for k, flow in enumerate(flows):
        mine = positions.setdefault(flow.phase, [])
        local.append(len(mine))
        mine.append(k)
    return positions, local


def phase_state(
    problem: Problem, spine: Sequence[int], paths: Sequence[PlanPath], positions: Sequence[int]
) -> PhaseState:
    """The state of one phase planned with these spines and paths."""
    fabric = problem.fabric
    uplinks, cap = fabric.uplinks, fabric.directed_gbps
    load = [0.0] * len(cap)
    on_link: dict[int, set[int]] = {}
    on_src: dict[int, set[int]] = {}
    on_dst: dict[int, set[int]] = {}
    on_leaf: dict[int, set[int]] = {}
    columns = zip(
        problem.src,
        problem.dst,
        problem.src_leaf,
        problem.dst_leaf,
        problem.gbps,
        spine,
        strict=True,
    )
    for f, (s, d, la, lb, g, at) in enumerate(columns):
        load[2 * s] += g
        load[2 * d + 1] += g
        on_src.setdefault(s, set()).add(f)
        on_dst.setdefault(d, set()).add(f)
        if problem.cands[f]:
            on_leaf.setdefault(la, set()).add(f)
            on_leaf.setdefault(lb, set()).add(f)
        if at >= 0:
            up, dn = 2 * uplinks[la][at], 2 * uplinks[lb][at] + 1
            load[up] += g
            load[dn] += g
            on_link.setdefault(up, set()).add(f)
            on_link.setdefault(dn, set()).add(f)
    return PhaseState(
        problem,
        tuple(spine),
        load,
        max(map(truediv, load, cap), default=0.0),
        tuple(paths),
        tuple(positions),
        _frozen(on_link),
        _frozen(on_src),
        _frozen(on_dst),
        _frozen(on_leaf),
    )


def _frozen(index: dict[int, set[int]]) -> Index:
    return {key: frozenset(value) for key, value in index.items()}


def plan_state(
    fabric: Fabric,
    result: Plan,
    flows: Flows,
    down: frozenset[int],
    hash_model: SwitchHash | None,
    phases: Mapping[str | None, tuple[Problem, Sequence[int], Sequence[PlanPath]]],
) -> PlanState:
    """The state of a plan made phase by phase: each phase's problem, spines and paths."""
    positions, local = phase_positions(flows.flows)
    return PlanState(
        fabric,
        result,
        flows.flows,
        down,
        hash_model,
        {
            phase: phase_state(problem, spine, paths, positions.get(phase, []))
            for phase, (problem, spine, paths) in phases.items()
        },
        local,
    )


def replan_fast(
    fabric: Fabric,
    previous: Plan,
    flows: Flows,
    down: Iterable[str],
    hash_model: SwitchHash | None,
) -> FastReplan | None:
    """`core.replan` from the previous plan's standing state; None when the full replan must
    run (no state kept, or a change it does not cover: see the module doc)."""
    state = recall(previous)
    if state is None or state.fabric is not fabric or state.hash_model is not hash_model:
        return None
    items, old = flows.flows, state.flows
    if len(items) != len(old):
        return None
    links_down = frozenset(fabric.link_indices((*flows.down, *down)))
    if not state.down <= links_down:
        return None  # a link came back: its flows' choices widen, the full replan runs
    changed: dict[str | None, dict[int, Flow]] = {}
    for k, (a, b) in enumerate(zip(items, old, strict=True)):
        if a is b or (a.id, a.src, a.dst, a.gbps, a.phase) == (b.id, b.src, b.dst, b.gbps, b.phase):
            continue
        if a.id != b.id or a.gbps != b.gbps or a.phase != b.phase:
            return None
        if a.src not in fabric.port_index or a.dst not in fabric.port_index:
            return None
        changed.setdefault(a.phase, {})[state.local[k]] = a
    added = links_down - state.down
    cables = len(fabric.port_ids)
    touched = {fabric.link_leaf[x] for x in added if x >= cables}
    every_touched = {fabric.link_leaf[x] for x in links_down if x >= cables}
    phases = dict(state.phases)
    problems: dict[str | None, Problem] = {}
    utils: dict[str | None, float] = {}
    paths = list(previous.paths)
    moved: list[int] = []
    for phase, before in state.phases.items():
        mine = changed.get(phase, {})
        outcome = _phase(
            before, mine, added, touched, every_touched, links_down, hash_model, cables
        )
        if outcome is None:
            return None
        after, util, changes = outcome
        phases[phase] = after
        problems[phase] = after.problem
        utils[phase] = util
        for f in changes:
            k = after.positions[f]
            if paths[k].links != after.paths[f].links:
                moved.append(k)
            paths[k] = after.paths[f]
    named = {phase: util for phase, util in utils.items() if phase is not None}
    # Every path and number comes from a valid plan: built without revalidating.
    result = Plan.model_construct(
        v=1,
        kind="plan",
        paths=tuple(paths),
        max_util=max(utils.values(), default=0.0),
        phases=named or None,
    )
    after_state = PlanState(fabric, result, items, links_down, hash_model, phases, state.local)
    remember(after_state)
    moved.sort()
    flows_moved = tuple(paths[k].flow for k in moved)
    return FastReplan(result, problems, utils, flows_moved, after_state)


def _phase(
    before: PhaseState,
    changed: dict[int, Flow],
    added: frozenset[int],
    touched: set[int],
    every_touched: set[int],
    links_down: frozenset[int],
    hash_model: SwitchHash | None,
    cables: int,
) -> tuple[PhaseState, float, list[int]] | None:
    """One phase replanned: its new state, its max_util, the flows whose path was rebuilt.
    None: the full replan must run."""
    p = before.problem
    fabric = p.fabric
    movable = set(changed)
    for x in added:
        if x < cables:
            # A cable down under a flow that stayed on its port: the full replan says so.
            if any(f not in changed for f in before.on_src.get(x, ())) or any(
                f not in changed for f in before.on_dst.get(x, ())
            ):
                return None
        else:
            movable.update(before.on_link.get(2 * x, ()))
            movable.update(before.on_link.get(2 * x + 1, ()))
    leafy: set[int] = set()
    for leaf in touched:
        leafy.update(before.on_leaf.get(leaf, ()))
    if not movable and not leafy:
        return before, before.util, []
    index = fabric.port_index
    src, dst = list(p.src), list(p.dst)
    src_leaf, dst_leaf = list(p.src_leaf), list(p.dst_leaf)
    cands = list(p.cands)
    for f, flow in changed.items():
        s, d = index[flow.src], index[flow.dst]
        if s in links_down or d in links_down:
            return None
        src[f], dst[f] = s, d
        src_leaf[f], dst_leaf[f] = fabric.port_leaf[s], fabric.port_leaf[d]
    pairs: dict[tuple[int, int], tuple[int, ...] | None] = {}
    for f in leafy | movable:
        pair = (src_leaf[f], dst_leaf[f])
        found = pairs.get(pair, ())
        if found == ():
            found = pairs[pair] = _cands(fabric, *pair, links_down, every_touched)
        if found is None:
            return None
        cands[f] = found
    problem = Problem(
        fabric=fabric,
        ids=p.ids,
        src=tuple(src),
        dst=tuple(dst),
        src_leaf=tuple(src_leaf),
        dst_leaf=tuple(dst_leaf),
        gbps=p.gbps,
        cands=tuple(cands),
        down=links_down,
    )
    on_link, on_leaf = _Edits(before.on_link), _Edits(before.on_leaf)
    on_src, on_dst = _Edits(before.on_src), _Edits(before.on_dst)
    spine = list(before.spine)
    load = list(before.load)
    gbps, uplinks = p.gbps, fabric.uplinks
    stale: set[int] = set()  # directed links whose load is to be summed again
    for f in movable:
        at = spine[f]
        if at >= 0:
            up, dn = 2 * uplinks[p.src_leaf[f]][at], 2 * uplinks[p.dst_leaf[f]][at] + 1
            on_link.drop(up, f)
            on_link.drop(dn, f)
            stale.update((up, dn))
        spine[f] = -1
    for f in changed:
        on_src.drop(p.src[f], f)
        on_dst.drop(p.dst[f], f)
        on_src.add(src[f], f)
        on_dst.add(dst[f], f)
        stale.update((2 * p.src[f], 2 * src[f], 2 * p.dst[f] + 1, 2 * dst[f] + 1))
        if p.cands[f]:
            on_leaf.drop(p.src_leaf[f], f)
            on_leaf.drop(p.dst_leaf[f], f)
        if cands[f]:
            on_leaf.add(src_leaf[f], f)
            on_leaf.add(dst_leaf[f], f)
    _resum(load, stale, on_link.done(), on_src.done(), on_dst.done(), spine, gbps, cables)
    assignment = Assignment.of(problem, load, spine)
    order = sorted(movable)
    target = assignment.max_util()
    least_loaded(assignment, order)
    repair(assignment, order, target)
    util = assignment.max_util()
    maker = PathMaker(problem, hash_model)
    paths = list(before.paths)
    rebuilt = []
    for f in order:
        paths[f] = maker.make(f, spine[f])
        rebuilt.append(f)
    if hash_model is not None:
        for f in sorted(leafy - movable):
            if not maker.keeps(f, spine[f], paths[f]):
                paths[f] = maker.make(f, spine[f])
                rebuilt.append(f)
    # The new state's loads in flow order again: a moved flow changed only links of its
    # own two leaves (up from its source leaf, down to its destination leaf).
    resum: set[int] = set()
    for f in order:
        at = spine[f]
        if at >= 0:
            up, dn = 2 * uplinks[src_leaf[f]][at], 2 * uplinks[dst_leaf[f]][at] + 1
            on_link.add(up, f)
            on_link.add(dn, f)
        if cands[f]:
            resum.update(2 * x for x in uplinks[src_leaf[f]].values())
            resum.update(2 * x + 1 for x in uplinks[dst_leaf[f]].values())
    links = on_link.done()
    _resum(load, resum, links, on_src.done(), on_dst.done(), spine, gbps, cables)
    after = PhaseState(
        problem,
        tuple(spine),
        load,
        max(map(truediv, load, fabric.directed_gbps), default=0.0),
        tuple(paths),
        before.positions,
        links,
        on_src.done(),
        on_dst.done(),
        on_leaf.done(),
    )
    return after, util, rebuilt


def _cands(
    fabric: Fabric, la: int, lb: int, links_down: frozenset[int], touched: set[int]
) -> tuple[int, ...] | None:
    """A flow's usable spines as `problem.build_problem_from` finds them; None: none left."""
    if la == lb:
        return ()
    plane = fabric.leaf_plane[la]
    if (
        plane == fabric.leaf_plane[lb]
        and fabric.full_mesh[plane]
        and la not in touched
        and lb not in touched
    ):
        return fabric.plane_spines[plane]
    if la in touched or lb in touched:
        found = fabric.usable_spines(la, lb, links_down)
    else:
        found = fabric.common_spines(la, lb)
    return found or None


class _Edits:
    """Changes to an index, applied as one new set per key changed: the old index is the
    previous plan's and stays as it is."""

    __slots__ = ("added", "dropped", "index")

    def __init__(self, index: Index) -> None:
        self.index = index
        self.added: dict[int, set[int]] = {}
        self.dropped: dict[int, set[int]] = {}

    def drop(self, key: int, f: int) -> None:
        self.dropped.setdefault(key, set()).add(f)
        self.added.get(key, set()).discard(f)

    def add(self, key: int, f: int) -> None:
        self.added.setdefault(key, set()).add(f)
        self.dropped.get(key, set()).discard(f)

    def done(self) -> Index:
        """The index with the changes so far (a copy; the changes are folded in)."""
        if self.added or self.dropped:
            index = dict(self.index)
            for key in self.added.keys() | self.dropped.keys():
                old = index.get(key, frozenset())
                index[key] = (old - self.dropped.get(key, set())) | self.added.get(key, set())
            self.index, self.added, self.dropped = index, {}, {}
        return self.index


def _resum(
    load: list[float],
    links: Iterable[int],
    on_link: Index,
    on_src: Index,
    on_dst: Index,
    spine: Sequence[int],
    gbps: Sequence[float],
    cables: int,
) -> None:
    """Sum these directed links' loads again, flow by flow in flow order, from the index."""
    for x in links:
        total = 0.0
        if x < 2 * cables:
            for f in sorted((on_dst if x & 1 else on_src).get(x >> 1, ())):
                total += gbps[f]
        else:
            for f in sorted(on_link.get(x, ())):
                if spine[f] >= 0:
                    total += gbps[f]
        load[x] = total

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
from itertools import islice
from operator import truediv

from planner.balance import TOLERANCE, Assignment, least_loaded, repair, repair_over
from planner.bound import leaf_bound, problem_bound
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
    cable_util: float  # the largest over the cables (what no plan changes)
    paths: Sequence[PlanPath]  # per flow of the phase
    positions: Sequence[int]  # per flow of the phase, its place in the flows file
    on_link: Index  # directed fabric link -> flows crossing it
    on_src: Index  # port -> flows leaving it
    on_dst: Index  # port -> flows arriving at it
    on_leaf: Index  # leaf -> inter-leaf flows leaving or arriving at it
    # Per (leaf, 0 up / 1 down): its part of the lower bound and the spines its flows may
    # use (`bound.problem_bound`); None where fabric links differ in speed (bound in full).
    terms: Terms | None


Terms = dict[tuple[int, int], tuple[float, frozenset[int]]]


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
    incremental: dict[str | None, float]  # each phase's, with only the forced flows moved
    moved: tuple[str, ...]  # flows whose links changed, in plan order
    forced: tuple[str, ...]  # of those, the ones the failure moved (see `choice`)
    bounds: dict[str | None, float]  # each phase's lower bound, when widening was asked for
    widened: bool  # flows the failure did not move moved too
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
    leaves = _frozen(on_leaf)
    cable_util = _cable_max(fabric, load)
    return PhaseState(
        problem,
        tuple(spine),
        load,
        max(cable_util, _fabric_max(fabric, load)),
        cable_util,
        tuple(paths),
        tuple(positions),
        _frozen(on_link),
        _frozen(on_src),
        _frozen(on_dst),
        leaves,
        _terms(problem, leaves, leaves) if _uniform(fabric) else None,
    )


def _uniform(fabric: Fabric) -> bool:
    """Whether every fabric link has one speed: then a leaf's terms are the bound's all."""
    return len(set(fabric.link_gbps[len(fabric.port_ids) :])) <= 1


def _terms(problem: Problem, on_leaf: Index, leaves: Iterable[int]) -> Terms:
    """The bound's terms of these leaves, each from its flows in flow order."""
    found: Terms = {}
    src_leaf, dst_leaf = problem.src_leaf, problem.dst_leaf
    for leaf in leaves:
        flows = sorted(on_leaf.get(leaf, ()))
        for direction, ends in ((0, src_leaf), (1, dst_leaf)):
            mine = [f for f in flows if ends[f] == leaf]
            if mine:
                found[(leaf, direction)] = leaf_bound(problem, leaf, direction, mine)
    return found


def phase_bound(phase: PhaseState) -> float:
    """The phase's lower bound, as `bound.problem_bound` finds it, from the kept terms."""
    return _bound(phase.problem, phase.cable_util, phase.terms)


def _cable_max(fabric: Fabric, load: Sequence[float]) -> float:
    """The largest utilisation over the cables (the first directed links)."""
    end = 2 * len(fabric.port_ids)
    return max(map(truediv, islice(load, end), fabric.directed_gbps[:end]), default=0.0)


def _fabric_max(fabric: Fabric, load: Sequence[float]) -> float:
    """The largest utilisation over the fabric links: with `_cable_max`, `max_util` in parts."""
    start = 2 * len(fabric.port_ids)
    return max(map(truediv, islice(load, start, None), fabric.directed_gbps[start:]), default=0.0)


def _still_usable(
    problem: Problem, flows: Iterable[int], leaf: int, direction: int, usable: frozenset[int]
) -> bool:
    """Whether this leaf's flows (one direction) may still use every spine they could."""
    ends = problem.dst_leaf if direction else problem.src_leaf
    seen: set[int] = set()
    for f in flows:
        if ends[f] == leaf:
            seen.update(problem.cands[f])
            if len(seen) == len(usable):  # new choices are among the old: the same
                return True
    return False


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
    widen: tuple[int, int] | None = None,
) -> FastReplan | None:
    """`core.replan` from the previous plan's standing state; None when the full replan must
    run (no state kept, or a change it does not cover: see the module doc). With ``widen``,
    `choice`'s incremental replan: each phase's bound found, and a phase the moved flows
    alone leave above it repaired with up to ``widen[0]`` steps of chains of up to
    ``widen[1]`` flows, any flow of the phase movable."""
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
    first: dict[str | None, float] = {}
    bounds: dict[str | None, float] = {}
    paths = list(previous.paths)
    moved: list[int] = []
    forced: list[int] = []
    widened = False
    for phase, before in state.phases.items():
        mine = changed.get(phase, {})
        outcome = _phase(
            before, mine, added, touched, every_touched, links_down, hash_model, cables, widen
        )
        if outcome is None:
            return None
        after = outcome.phase
        phases[phase] = after
        problems[phase] = after.problem
        utils[phase] = outcome.util
        first[phase] = outcome.first
        if outcome.bound is not None:
            bounds[phase] = outcome.bound
        widened = widened or outcome.widened
        forced += [after.positions[f] for f in outcome.forced]
        for f in outcome.rebuilt:
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
    forced.sort()
    return FastReplan(
        result,
        problems,
        utils,
        first,
        tuple(paths[k].flow for k in moved),
        tuple(paths[k].flow for k in forced),
        bounds,
        widened,
        after_state,
    )


def _phase(
    before: PhaseState,
    changed: dict[int, Flow],
    added: frozenset[int],
    touched: set[int],
    every_touched: set[int],
    links_down: frozenset[int],
    hash_model: SwitchHash | None,
    cables: int,
    widen: tuple[int, int] | None,
) -> _Outcome | None:
    """One phase replanned (see `_Outcome`); None: the full replan must run. With ``widen``
    (repair steps, chain length) the phase's bound is found, and when the moved flows alone
    cannot reach it, others may move too (`choice`)."""
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
        bound = phase_bound(before) if widen is not None else None
        return _Outcome(before, before.util, before.util, [], [], bound, widened=False)
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
    # max_util in two parts: the cables change only under failed-over flows.
    cable_util = _cable_max(fabric, load) if changed else before.cable_util
    target = max(cable_util, _fabric_max(fabric, load))
    least_loaded(assignment, order)
    repair(assignment, order, target)
    util = max(cable_util, _fabric_max(fabric, load))
    for f in order:
        at = spine[f]
        if at >= 0:
            on_link.add(2 * uplinks[src_leaf[f]][at], f)
            on_link.add(2 * uplinks[dst_leaf[f]][at] + 1, f)
    leaves = on_leaf.done()
    terms = _derived_terms(before, problem, leaves, touched, leafy, changed)
    forced = [f for f in order if f in changed or spine[f] != before.spine[f]]
    bound = _bound(problem, cable_util, terms) if widen is not None else None
    more: set[int] = set()
    first = util
    if widen is not None and bound is not None and forced and util > bound + TOLERANCE:
        # Some flows that stay would have to move for the phase to reach its bound: a few
        # may (`choice`), from the same loads as the full replan's.
        kept_spine, kept_load = list(spine), list(load)
        more = repair_over(assignment, on_link.done(), bound, widen[0], widen[1])
        widened = max(cable_util, _fabric_max(fabric, load))
        if widened < util - TOLERANCE:
            util = widened
            for f in more:
                was, at = kept_spine[f], spine[f]
                on_link.drop(2 * uplinks[src_leaf[f]][was], f)
                on_link.drop(2 * uplinks[dst_leaf[f]][was] + 1, f)
                on_link.add(2 * uplinks[src_leaf[f]][at], f)
                on_link.add(2 * uplinks[dst_leaf[f]][at] + 1, f)
        else:
            more = set()
            spine[:], load[:] = kept_spine, kept_load
    maker = PathMaker(problem, hash_model)
    paths = list(before.paths)
    placed = sorted(movable | more)
    rebuilt = []
    for f in placed:
        paths[f] = maker.make(f, spine[f])
        rebuilt.append(f)
    if hash_model is not None:
        for f in sorted(leafy - movable - more):
            if not maker.keeps(f, spine[f], paths[f]):
                paths[f] = maker.make(f, spine[f])
                rebuilt.append(f)
    # The new state's loads in flow order again: a moved flow changed only links of its
    # own two leaves (up from its source leaf, down to its destination leaf).
    resum: set[int] = set()
    for f in placed:
        if cands[f]:
            resum.update(2 * x for x in uplinks[src_leaf[f]].values())
            resum.update(2 * x + 1 for x in uplinks[dst_leaf[f]].values())
    links = on_link.done()
    _resum(load, resum, links, on_src.done(), on_dst.done(), spine, gbps, cables)
    after = PhaseState(
        problem,
        tuple(spine),
        load,
        max(cable_util, _fabric_max(fabric, load)),
        cable_util,
        tuple(paths),
        before.positions,
        links,
        on_src.done(),
        on_dst.done(),
        leaves,
        terms,
    )
    return _Outcome(after, util, first, rebuilt, forced, bound, widened=bool(more))


def _derived_terms(
    before: PhaseState,
    problem: Problem,
    on_leaf: Index,
    touched: set[int],
    leafy: set[int],
    changed: dict[int, Flow],
) -> Terms | None:
    """The bound's terms after the failure: leaves with a down uplink or a failed-over flow
    summed again; a leaf at the other end of a flow whose spines shrank only if its flows
    lost a spine they all could use."""
    if before.terms is None:
        return None
    terms = dict(before.terms)
    old = before.problem
    again = set(touched)
    for f in changed:
        again.update((old.src_leaf[f], old.dst_leaf[f], problem.src_leaf[f], problem.dst_leaf[f]))
    for key in [key for key in terms if key[0] in again]:
        del terms[key]
    terms.update(_terms(problem, on_leaf, again))
    check = {(problem.src_leaf[f], 0) for f in leafy} | {(problem.dst_leaf[f], 1) for f in leafy}
    for leaf, direction in check:
        known = terms.get((leaf, direction))
        if leaf in again or known is None:
            continue
        flows = on_leaf.get(leaf, frozenset())
        if not _still_usable(problem, flows, leaf, direction, known[1]):
            mine = sorted(
                f for f in flows if (problem.dst_leaf if direction else problem.src_leaf)[f] == leaf
            )
            terms[(leaf, direction)] = leaf_bound(problem, leaf, direction, mine)
    return terms


def _bound(problem: Problem, cable_util: float, terms: Terms | None) -> float:
    """The phase's lower bound (`phase_bound`) from its cables' utilisation and terms."""
    if terms is None:
        return problem_bound(problem)
    return max(cable_util, max((term for term, _ in terms.values()), default=0.0))


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One phase replanned."""

    phase: PhaseState
    util: float  # its max_util
    first: float  # its max_util with only the flows the failure moved moved
    rebuilt: list[int]  # flows whose path was made anew
    forced: list[int]  # flows the failure moved (on a down link, or failed over)
    bound: float | None  # its lower bound, when asked for
    widened: bool  # other flows moved too


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

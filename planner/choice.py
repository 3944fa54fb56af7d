"""Replanning after a failure: the incremental plan by default, a better one when allowed.

The trade-off. Every flow that moves is a path change on a running job: its queue pair is
re-steered (a new UDP source port) and its packets may arrive out of order for a moment.
`core.replan` moves only the flows that crossed a down link (and places new flows). Its
price: the flows that stay pin the spines around the failure, so the moved flows can end up
sharing a link where a fresh plan would not (a fabric with every uplink at 1.0 loses a link
and that plan reaches 1.5 while the lower bound is 1.0).

``mode="incremental"`` (the default, what reroute puts in force) starts there and, in a
phase where the failure moved flows and the phase is left above its lower bound, lets a few
other flows of the phase move:
a repair of at most `WIDEN_STEPS` steps, each one flow or one ejection chain of up to
`WIDE_CHAIN` flows (typically one to four more flows move). It takes the result only if the
phase's ``max_util`` fell; the strategy is then ``widened``, and ``moved`` beyond ``forced``
are the flows that moved without having to. What it still misses of a bound, the result
says per phase (``utils`` against ``bounds``).

``mode="best"`` trades more moves for a lower ``max_util``, in this order, stopping at the
lower bound:
1. the incremental plan;
2. widened: from there, a repair that may move any flow, one flow or one short ejection chain
   at a time (a Kempe chain for equal flows), with no limit on its steps;
3. a full replan: taken only when strictly better than the best so far, it may move a large
   share of all flows.
The result says which was taken and which flows moved. A phased flows file is replanned
phase by phase (phases do not share time), each phase stopping at its own bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from planner.balance import TOLERANCE, repair
from planner.bound import problem_bound
from planner.core import build_plan, incremental, moved_flows, solve
from planner.phases import join, previous_by_phase, split
from planner.problem import build_problem
from planner.standing import replan_fast
from schemas.files import Flows, Plan, PlanPath
from topology.ecmp import SwitchHash
from topology.model import Fabric

ReplanMode = Literal["incremental", "best"]
REPLAN_MODES: tuple[ReplanMode, ...] = ("incremental", "best")
Strategy = Literal["incremental", "widened", "full"]
# An ejection chain of up to this many flows per repair step: long enough to cross a large
# tight fabric (every link at the bound), short enough to stay a local change.
WIDE_CHAIN = 16
# The incremental replan's repair steps beyond the flows it must move, in a phase left above
# its bound: a bounded change (at most this many chains) on a running job.
WIDEN_STEPS = 8


@dataclass(frozen=True, slots=True)
class Replanned:
    """A replan, how it was reached, and what it cost in moved flows."""

    plan: Plan
    strategy: Strategy
    moved: tuple[str, ...]  # flows whose path changed (new flows included), in plan order
    forced: tuple[str, ...]  # the flows the failure moved (on a down link, failed over)
    incremental_max_util: float  # with only those moved
    bound: float
    # Per phase (None: the unnamed one), its max_util and its lower bound.
    utils: Mapping[str | None, float] = field(default_factory=dict)
    bounds: Mapping[str | None, float] = field(default_factory=dict)

    def misses(self) -> dict[str | None, float]:
        """The phases above their bound, and by how much (`misses`)."""
        return misses(self.utils, self.bounds)

    @property
    def extra_moves(self) -> int:
        """Flows moved beyond those that had to."""
        return len(self.moved) - len(self.forced)


def misses(
    utils: Mapping[str | None, float], bounds: Mapping[str | None, float]
) -> dict[str | None, float]:
    """The phases whose max_util is above their bound, and by how much (max_util over bound,
    minus 1: 0.25 is 25% above)."""
    return {
        phase: util / bounds[phase] - 1
        for phase, util in utils.items()
        if phase in bounds and util > bounds[phase] + TOLERANCE
    }


def replan_choice(
    fabric: Fabric,
    previous: Plan,
    flows: Flows,
    down: Iterable[str] = (),
    hash_model: SwitchHash | None = None,
    mode: ReplanMode = "incremental",
) -> Replanned:
    """The replan of ``mode`` (see the module doc); raises what `core.replan` raises."""
    down = tuple(down)
    fast = replan_fast(fabric, previous, flows, down, hash_model, (WIDEN_STEPS, WIDE_CHAIN))
    if fast is not None:
        # Touched only what the failure affects (`standing`), bounds included.
        bounds, utils = fast.bounds, fast.utils
        reached = all(utils[phase] <= bound + TOLERANCE for phase, bound in bounds.items())
        if mode == "incremental" or reached:
            return Replanned(
                fast.plan,
                "widened" if fast.widened else "incremental",
                fast.moved,
                fast.forced,
                max(fast.incremental.values(), default=0.0),
                max(bounds.values(), default=0.0),
                utils,
                bounds,
            )
    parts = split(flows)
    if parts is None:
        return _choice_one(fabric, previous, flows, down, hash_model, mode)
    before = previous_by_phase(previous, flows)
    chosen = {
        phase: _choice_one(fabric, before[phase], part, down, hash_model, mode)
        for phase, part in parts.items()
    }
    return _joined(previous, flows, chosen)


def _choice_one(
    fabric: Fabric,
    previous: Plan,
    flows: Flows,
    down: Iterable[str],
    hash_model: SwitchHash | None,
    mode: ReplanMode,
) -> Replanned:
    """`replan_choice` of flows that all run at the same time (one phase)."""
    problem = build_problem(fabric, flows, down)
    state, kept = incremental(problem, previous)
    first = build_plan(problem, state, hash_model, kept)
    forced = tuple(moved_flows(previous, first))
    bound = problem_bound(problem)
    phase = flows.flows[0].phase if flows.flows else None
    best = Replanned(
        first, "incremental", forced, forced, first.max_util, bound, *_one(phase, first, bound)
    )
    if first.max_util <= bound + TOLERANCE or (mode == "incremental" and not forced):
        return best  # at the bound; or no flow had to move here: no other flow moves either
    before = list(state.spine)
    steps = WIDEN_STEPS if mode == "incremental" else None
    repair(state, problem.inter_leaf(), bound, max_moves=steps, chain=WIDE_CHAIN)
    if state.max_util() < first.max_util - TOLERANCE:
        still = _same_spine(problem.ids, before, state.spine, kept)
        widened = build_plan(problem, state, hash_model, still)
        moved = tuple(moved_flows(previous, widened))
        best = Replanned(
            widened, "widened", moved, forced, first.max_util, bound, *_one(phase, widened, bound)
        )
        if mode == "incremental" or widened.max_util <= bound + TOLERANCE:
            return best
    elif mode == "incremental":
        return best
    fresh = solve(problem)
    if fresh.max_util() < best.plan.max_util - TOLERANCE:
        # Flows the fresh plan happens to leave on their old spine keep their path object.
        old = {path.flow: path for path in previous.paths}
        index = fabric.spine_index
        same = {
            flow: path
            for flow, s in zip(problem.ids, fresh.spine, strict=True)
            if (path := old.get(flow)) is not None
            and (-1 if path.via is None else index.get(path.via, -2)) == s
            and flow in kept
        }
        full = build_plan(problem, fresh, hash_model, same)
        moved = tuple(moved_flows(previous, full))
        best = Replanned(
            full, "full", moved, forced, first.max_util, bound, *_one(phase, full, bound)
        )
    return best


def _one(
    phase: str | None, result: Plan, bound: float
) -> tuple[dict[str | None, float], dict[str | None, float]]:
    """A single phase's max_util and bound, by phase."""
    return {phase: result.max_util}, {phase: bound}


def _same_spine(
    ids: tuple[str, ...], before: list[int], after: list[int], kept: dict[str, PlanPath]
) -> dict[str, PlanPath]:
    """The kept paths of the flows still on the spine they had."""
    return {
        flow: path
        for flow, a, b in zip(ids, before, after, strict=True)
        if a == b and (path := kept.get(flow)) is not None
    }


def _joined(previous: Plan, flows: Flows, chosen: dict[str | None, Replanned]) -> Replanned:
    """The phases' replans as one: the most far-reaching strategy any phase took."""
    result = join(flows, {phase: r.plan for phase, r in chosen.items()})
    forced = {flow for r in chosen.values() for flow in r.forced}
    order: tuple[Strategy, ...] = ("incremental", "widened", "full")
    strategy = max((r.strategy for r in chosen.values()), key=order.index)
    return Replanned(
        plan=result,
        strategy=strategy,
        moved=tuple(moved_flows(previous, result)),
        forced=tuple(path.flow for path in result.paths if path.flow in forced),
        incremental_max_util=max(r.incremental_max_util for r in chosen.values()),
        bound=max(r.bound for r in chosen.values()),
        utils={phase: util for r in chosen.values() for phase, util in r.utils.items()},
        bounds={phase: bound for r in chosen.values() for phase, bound in r.bounds.items()},
    )

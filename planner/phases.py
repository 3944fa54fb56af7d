"""Flows by phase: a phased flows file is planned one phase at a time, the plans joined.

Flows of different phases never run at the same time (the contract's ``phase``), so a link
carries one phase's flows at a time: each phase is its own planning problem, and the plan's
``max_util`` is the largest of the phases' (`join`). The objective of an iteration, each
phase's largest link utilisation weighted by its bytes, separates by phase: a plan at every
phase's bound minimises it, whatever the weights. Flows without a phase are the unnamed
phase: a file without phases is one problem, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas.files import Flows, Plan, PlanPath


def split(flows: Flows) -> dict[str | None, Flows] | None:
    """Per phase (None: unnamed), its flows with the file's ``down``; None when no flow has one."""
    if all(flow.phase is None for flow in flows.flows):
        return None
    parts: dict[str | None, list[int]] = {}
    for index, flow in enumerate(flows.flows):
        parts.setdefault(flow.phase, []).append(index)
    if len(parts) == 1:
        return {flows.flows[0].phase: flows}
    items = flows.flows
    # Parts of a valid file are valid (ids unique, ends distinct): built without revalidating.
    return {
        phase: Flows.model_construct(
            v=1, kind="flows", flows=tuple(items[i] for i in members), down=flows.down
        )
        for phase, members in parts.items()
    }


def previous_by_phase(previous: Plan, flows: Flows) -> dict[str | None, Plan]:
    """The previous plan's paths split by the phase their flow has now (one pass); the paths
    of flows that are gone are left out, and every phase of the flows is there (maybe empty).
    A replan of each phase keeps its own."""
    phase_of = {flow.id: flow.phase for flow in flows.flows}
    parts: dict[str | None, list[PlanPath]] = {phase: [] for phase in set(phase_of.values())}
    for path in previous.paths:
        if path.flow in phase_of:
            parts[phase_of[path.flow]].append(path)
    return {
        phase: Plan.model_construct(
            v=1, kind="plan", paths=tuple(paths), max_util=previous.max_util
        )
        for phase, paths in parts.items()
    }


def join(flows: Flows, plans: Mapping[str | None, Plan]) -> Plan:
    """One plan of the phases' plans: paths in the flows' order, the largest ``max_util``, and
    each named phase's own."""
    worst = max((result.max_util for result in plans.values()), default=0.0)
    named = {phase: result.max_util for phase, result in plans.items() if phase is not None}
    if len(plans) == 1:
        (only,) = plans.values()
        return only.model_copy(update={"phases": named or None})
    by_flow: dict[str, PlanPath] = {}
    for result in plans.values():
        for path in result.paths:
            by_flow[path.flow] = path
    paths = tuple(by_flow[flow.id] for flow in flows.flows)
    # Every path and number comes from a valid plan: built without revalidating.
    return Plan.model_construct(v=1, kind="plan", paths=paths, max_util=worst, phases=named or None)

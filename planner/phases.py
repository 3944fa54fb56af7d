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
    items = flows.flows
    return {
        phase: Flows(v=1, kind="flows", flows=tuple(items[i] for i in members), down=flows.down)
        for phase, members in parts.items()
    }


def previous_of(previous: Plan, part: Flows) -> Plan:
    """The previous plan's paths of one phase's flows (a replan of the phase keeps them)."""
    wanted = {flow.id for flow in part.flows}
    paths = tuple(path for path in previous.paths if path.flow in wanted)
    return Plan(v=1, kind="plan", paths=paths, max_util=previous.max_util)


def join(flows: Flows, plans: Mapping[str | None, Plan]) -> Plan:
    """One plan of the phases' plans: paths in the flows' order, the largest ``max_util``, and
    each named phase's own."""
    by_flow: dict[str, PlanPath] = {}
    for result in plans.values():
        for path in result.paths:
            by_flow[path.flow] = path
    paths = tuple(by_flow[flow.id] for flow in flows.flows)
    worst = max((result.max_util for result in plans.values()), default=0.0)
    named = {phase: result.max_util for phase, result in plans.items() if phase is not None}
    return Plan(v=1, kind="plan", paths=paths, max_util=worst, phases=named or None)

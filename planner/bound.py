"""The lower bound on ``max_util``: demand that must cross a link, over its capacity.

No plan does better than any of these, so a plan that meets the largest is optimal:
- a port's cable carries every flow from (or to) the port, whatever the plan;
- a flow takes one path: its demand over the best capacity among its usable spines;
- a leaf's inter-leaf demand leaves by its usable uplinks (and arrives by its downlinks):
  the total over their summed capacity;
- and, flows being unsplittable, pigeonhole: of the ``k * S + 1`` largest flows leaving a leaf
  with ``S`` usable uplinks, some ``k + 1`` share one uplink; they carry at least the ``k + 1``
  smallest of them. For equal demands that is ``ceil(n / S)`` flows on some uplink.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from planner.problem import Problem
from topology.model import Fabric


def problem_bound(problem: Problem, cables: bool = True) -> float:
    """The largest of the bounds above, for a problem; without ``cables``, of the fabric's
    links alone (what a plan can change: the cables carry the same whatever it does)."""
    fabric, cap = problem.fabric, problem.fabric.directed_gbps
    best = 0.0
    if cables:
        loads: dict[int, float] = {}
        for s, d, g in zip(problem.src, problem.dst, problem.gbps, strict=True):
            loads[2 * s] = loads.get(2 * s, 0.0) + g
            loads[2 * d + 1] = loads.get(2 * d + 1, 0.0) + g
        best = max((load / cap[x] for x, load in loads.items()), default=0.0)
    fabric_gbps = set(fabric.link_gbps[len(fabric.port_ids) :])
    uniform = next(iter(fabric_gbps)) if len(fabric_gbps) == 1 else None
    pair_capacity: dict[tuple[int, int], float] = {}
    # Per leaf and side: the demands, and the distinct usable-spine tuples (shared per pair).
    out: dict[int, tuple[list[float], dict[int, tuple[int, ...]]]] = {}
    into: dict[int, tuple[list[float], dict[int, tuple[int, ...]]]] = {}
    uplinks = fabric.uplinks
    for f, spines in enumerate(problem.cands):
        if not spines:
            continue
        g, la, lb = problem.gbps[f], problem.src_leaf[f], problem.dst_leaf[f]
        if uniform is not None:
            widest = uniform
        else:
            key = (la, lb)
            found = pair_capacity.get(key)
            if found is None:
                found = max(
                    min(cap[2 * uplinks[la][s]], cap[2 * uplinks[lb][s] + 1]) for s in spines
                )
                pair_capacity[key] = found
            widest = found
        best = max(best, g / widest)
        for table, leaf in ((out, la), (into, lb)):
            entry = table.get(leaf)
            if entry is None:
                entry = ([], {})
                table[leaf] = entry
            entry[0].append(g)
            entry[1][id(spines)] = spines
    for table, direction in ((out, 0), (into, 1)):
        for leaf, (demands, groups) in table.items():
            best = max(best, _leaf_term(fabric, leaf, direction, demands, groups.values())[0])
    return best


def leaf_bound(
    problem: Problem, leaf: int, direction: int, flows: Sequence[int]
) -> tuple[float, frozenset[int]]:
    """One leaf's part of `problem_bound` (``direction`` 0: its uplinks, 1: its downlinks)
    from its inter-leaf flows leaving (arriving at) it, in flow order; and the spines they
    may use."""
    demands = [problem.gbps[f] for f in flows]
    groups = {id(problem.cands[f]): problem.cands[f] for f in flows}
    return _leaf_term(problem.fabric, leaf, direction, demands, groups.values())


def _leaf_term(
    fabric: Fabric,
    leaf: int,
    direction: int,
    demands: list[float],
    groups: Iterable[tuple[int, ...]],
) -> tuple[float, frozenset[int]]:
    usable = frozenset().union(*groups)
    cap, uplinks = fabric.directed_gbps, fabric.uplinks
    caps = [cap[2 * uplinks[leaf][s] + direction] for s in usable]
    term = max(sum(demands) / sum(caps), _pigeonhole(demands, len(caps)) / max(caps))
    return term, usable


def _pigeonhole(demands: Iterable[float], bins: int) -> float:
    """The least load of the fullest of ``bins`` bins holding these unsplittable demands."""
    items = sorted(demands, reverse=True)
    prefix = [0.0]
    for x in items:
        prefix.append(prefix[-1] + x)
    best, k = 0.0, 1
    while k * bins + 1 <= len(items):
        m = k * bins + 1
        best = max(best, prefix[m] - prefix[m - k - 1])
        k += 1
    return max(best, items[0] if items else 0.0)

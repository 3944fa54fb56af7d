"""Link loads of a spine assignment, and the balanced heuristic: least-loaded, then repair.

The assignment is the planner's one mutable object: flat lists indexed by directed link and
by flow, changed in place, because copying 10k-entry lists per move would dominate the time.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import truediv
from typing import Any

from planner.problem import Problem

# Utilisations are ratios of float sums; anything closer than this is the same value.
TOLERANCE = 1e-9


class Assignment:
    """A spine per flow (-1: none, or within one leaf) and the load of every directed link."""

    __slots__ = ("cap", "load", "problem", "spine")

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.cap: Sequence[float] = problem.fabric.directed_gbps
        load = [0.0] * len(self.cap)
        # Every flow crosses its own two cables whatever the plan: charge them once here.
        for s, d, g in zip(problem.src, problem.dst, problem.gbps, strict=True):
            load[2 * s] += g
            load[2 * d + 1] += g
        self.load = load
        self.spine = [-1] * problem.size

    @classmethod
    def of(cls, problem: Problem, load: list[float], spine: list[int]) -> Assignment:
        """An assignment with these loads and spines, taken as they are (not copied)."""
        state = cls.__new__(cls)
        state.problem, state.cap, state.load, state.spine = (
            problem,
            problem.fabric.directed_gbps,
            load,
            spine,
        )
        return state

    def place(self, f: int, spine: int) -> None:
        """Route flow ``f`` through ``spine`` (it must have none)."""
        p, g = self.problem, self.problem.gbps[f]
        self.load[p.up(f, spine)] += g
        self.load[p.dn(f, spine)] += g
        self.spine[f] = spine

    def unplace(self, f: int) -> None:
        """Take flow ``f`` off its spine."""
        spine = self.spine[f]
        if spine >= 0:
            p, g = self.problem, self.problem.gbps[f]
            self.load[p.up(f, spine)] -= g
            self.load[p.dn(f, spine)] -= g
            self.spine[f] = -1

    def util(self, link: int) -> float:
        """The utilisation of one directed link."""
        return self.load[link] / self.cap[link]

    def max_util(self) -> float:
        """The largest utilisation over every directed link (the contract's ``max_util``)."""
        return max(map(truediv, self.load, self.cap), default=0.0)

    def fabric_max(self, flows: Iterable[int]) -> float:
        """The largest utilisation over the fabric links that these flows use."""
        p, load, cap, spine = self.problem, self.load, self.cap, self.spine
        worst = 0.0
        for f in flows:
            s = spine[f]
            if s >= 0:
                u, d = p.up(f, s), p.dn(f, s)
                worst = max(worst, load[u] / cap[u], load[d] / cap[d])
        return worst


def least_loaded(state: Assignment, flows: Iterable[int]) -> None:
    """Place flows, largest first, each on the spine that keeps its two links least utilised.

    A flow without candidate spines keeps none (-1): within one leaf it has a single path
    (a flow failed over to sibling ports can land there), and `build_problem` already
    refused an inter-leaf flow with no usable spine.
    """
    p = state.problem
    load, cap, gbps, spine = state.load, state.cap, p.gbps, state.spine
    uplinks, src_leaf, dst_leaf, cands = p.fabric.uplinks, p.src_leaf, p.dst_leaf, p.cands
    for f in sorted(flows, key=lambda f: (-gbps[f], f)):
        if not cands[f]:
            continue
        g = gbps[f]
        ups, dns = uplinks[src_leaf[f]], uplinks[dst_leaf[f]]
        best, best_worst, best_sum = -1, float("inf"), float("inf")
        for s in cands[f]:
            u, d = 2 * ups[s], 2 * dns[s] + 1
            nu, nd = (load[u] + g) / cap[u], (load[d] + g) / cap[d]
            worst = nu if nu > nd else nd
            if worst < best_worst - TOLERANCE or (
                worst <= best_worst + TOLERANCE and nu + nd < best_sum - TOLERANCE
            ):
                best, best_worst, best_sum = s, worst, nu + nd
        load[2 * ups[best]] += g
        load[2 * dns[best] + 1] += g
        spine[f] = best


def repair(
    state: Assignment,
    flows: Sequence[int],
    target: float,
    movable: Iterable[int] | None = None,
    max_moves: int | None = None,
    chain: int = 2,
) -> int:
    """Lower the most utilised fabric link by moving flows off it; returns the moves made.

    Looks at the fabric links of ``flows``; moves only flows in ``movable`` (default: all of
    ``flows``). A move is a single flow to another spine, or a chain of two: a flow to a
    spine where one of its links is full, and a flow on that link to another spine (with
    two spines exchanged, a Kempe chain of length two). With ``chain`` above 2, longer
    chains are searched breadth-first too (an ejection chain: each flow pushes one flow off
    the link it fills, up to ``chain`` flows; for equal demands an augmenting path). Each
    accepted move leaves every link it loads below the current maximum, so the maximum
    never rises and the search ends. Stops at ``target`` (nothing can go below it: the lower
    bound, or in a replan the maximum of the flows that stay) or when the worst link cannot
    be relieved.
    """
    repairer = _Repair(state, flows, movable, chain)
    return repairer.run(target, max_moves if max_moves is not None else 20 * len(flows) + 100)


def repair_over(
    state: Assignment,
    on: Mapping[int, Collection[int]],
    target: float,
    max_moves: int,
    chain: int = 2,
) -> set[int]:
    """`repair` of every flow of ``on`` (directed fabric link -> the flows crossing it, as
    the state has them; left as it is), each movable; returns the flows it moved.

    The same moves as ``repair(state, flows, target, None, max_moves, chain)`` with every
    flow in ``flows``, without a pass over them: only the links above ``target`` are looked
    at first, and a link's flows are copied when a move changes them.
    """
    repairer = _Repair(state, (), None, chain)
    lazy = _CopiedOnUse(on)
    repairer.on, repairer.movable = lazy, _Everyone()
    load, cap, limit = state.load, state.cap, target + TOLERANCE
    repairer.heap = [(-load[x] / cap[x], x) for x in on if load[x] / cap[x] > limit]
    heapq.heapify(repairer.heap)
    spine, before = state.spine, list(state.spine)
    repairer.run(target, max_moves)
    # A moved flow joined a link's flows, so it is in a copy.
    return {f for flows in lazy.values() for f in flows if spine[f] != before[f]}


class _Everyone(set[int]):
    """Every flow is movable."""

    def __contains__(self, f: object) -> bool:
        return True


class _CopiedOnUse(dict[int, set[int]]):
    """A link's flows from ``base``, copied into this dict the first time they are asked for
    to be changed; reads see the copy once there is one, else the base."""

    def __init__(self, base: Mapping[int, Collection[int]]) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, key: int) -> set[int]:
        value = set(self.base.get(key, ()))
        self[key] = value
        return value

    def get(self, key: int, default: Any = None) -> Any:
        if key in self:
            return self[key]
        return self.base.get(key, default)

    def setdefault(self, key: int, default: Any = None) -> Any:
        return self[key]


class _Repair:
    """The working set of one repair: which flows cross which link, and a max-heap of links."""

    def __init__(
        self,
        state: Assignment,
        flows: Sequence[int],
        movable: Iterable[int] | None,
        chain: int = 2,
    ) -> None:
        self.state = state
        self.chain = chain
        self.movable = set(flows if movable is None else movable)
        self.on: dict[int, set[int]] = {}
        p, spine = state.problem, state.spine
        for f in flows:
            s = spine[f]
            if s >= 0:
                self.on.setdefault(p.up(f, s), set()).add(f)
                self.on.setdefault(p.dn(f, s), set()).add(f)
        load, cap = state.load, state.cap
        self.heap = [(-load[link] / cap[link], link) for link in self.on]
        heapq.heapify(self.heap)

    def run(self, target: float, max_moves: int) -> int:
        load, cap, heap = self.state.load, self.state.cap, self.heap
        moves = 0
        while heap and moves < max_moves:
            negative, link = heap[0]
            util = load[link] / cap[link]
            if -negative != util:  # stale: the link changed since; a fresh entry exists
                heapq.heappop(heap)
                continue
            if util <= target + TOLERANCE or not self._relieve(link, util):
                break
            moves += 1
        return moves

    def _relieve(self, link: int, worst: float) -> bool:
        state, p = self.state, self.state.problem
        load, cap, spine, gbps = state.load, state.cap, state.spine, p.gbps
        limit = worst - TOLERANCE
        crossing = sorted(
            (f for f in self.on.get(link, ()) if f in self.movable), key=lambda f: (-gbps[f], f)
        )
        for f in crossing:
            g, best, best_worst = gbps[f], -1, limit
            for s in p.cands[f]:
                if s == spine[f]:
                    continue
                u, d = p.up(f, s), p.dn(f, s)
                new = max((load[u] + g) / cap[u], (load[d] + g) / cap[d])
                if new < best_worst:
                    best, best_worst = s, new
            if best >= 0:
                self._apply(((f, best),))
                return True
        for f in crossing:
            if self._swap(f, link, limit):
                return True
        return self.chain > 2 and self._eject(crossing, link, limit)

    def _swap(self, f: int, link: int, limit: float) -> bool:
        """Move f to another spine s2, and a flow h that blocks it there to any spine s3."""
        state, p = self.state, self.state.problem
        load, cap, spine = state.load, state.cap, state.spine
        s1, g = spine[f], p.gbps[f]
        for s2 in p.cands[f]:
            if s2 == s1:
                continue
            u, d = p.up(f, s2), p.dn(f, s2)
            blocked = [x for x in (u, d) if (load[x] + g) / cap[x] >= limit]
            if len(blocked) != 1:
                continue
            for h in sorted(self.on.get(blocked[0], ())):
                if h == f or h not in self.movable:
                    continue
                for s3 in p.cands[h]:
                    if s3 == spine[h]:
                        continue
                    changes = ((f, s2), (h, s3))
                    if self._improves(changes, link, limit):
                        self._apply(changes)
                        return True
        return False

    def _eject(self, crossing: list[int], link: int, limit: float) -> bool:
        """A chain of up to ``self.chain`` moves, found breadth-first over the links it fills.

        Each step moves a flow to a spine where exactly one of its links would reach the
        limit, counting what the chain's earlier moves freed or added there, then a flow on
        that link onward; the chain ends with a move that fills nothing (in an edge colouring,
        a Kempe chain of two spines). Every link is expanded once per search: bounded.
        """
        Step = tuple[int, tuple[tuple[int, int], ...], dict[int, float]]
        frontier: list[Step] = []
        for f in crossing:
            for s, x, delta in self._onward(f, limit, {}):
                if x >= 0:
                    frontier.append((x, ((f, s),), delta))
        seen = {link}
        for _ in range(self.chain - 1):
            following: list[Step] = []
            for x, changes, delta in frontier:
                if x in seen:
                    continue
                seen.add(x)
                chained = {f for f, _ in changes}
                for h in sorted(self.on.get(x, ())):
                    if h in chained or h not in self.movable:
                        continue
                    for s, y, after in self._onward(h, limit, delta):
                        longer = (*changes, (h, s))
                        if y < 0:
                            if self._improves(longer, link, limit):
                                self._apply(longer)
                                return True
                        elif y not in seen:
                            following.append((y, longer, after))
            frontier = following
            if not frontier:
                break
        return False

    def _onward(
        self, f: int, limit: float, delta: dict[int, float]
    ) -> list[tuple[int, int, dict[int, float]]]:
        """The other spines of ``f``, the one link each would fill (-1: none), and the load
        changes of the chain with that move added."""
        state, p = self.state, self.state.problem
        load, cap, current, g = state.load, state.cap, state.spine[f], p.gbps[f]
        old = (p.up(f, current), p.dn(f, current))
        out: list[tuple[int, int, dict[int, float]]] = []
        for s in p.cands[f]:
            if s == current:
                continue
            new = (p.up(f, s), p.dn(f, s))
            full = [x for x in new if (load[x] + delta.get(x, 0.0) + g) / cap[x] >= limit]
            if len(full) < 2:
                after = dict(delta)
                for x in old:
                    after[x] = after.get(x, 0.0) - g
                for x in new:
                    after[x] = after.get(x, 0.0) + g
                out.append((s, full[0] if full else -1, after))
        return out

    def _improves(self, changes: tuple[tuple[int, int], ...], link: int, limit: float) -> bool:
        state, p = self.state, self.state.problem
        delta: dict[int, float] = {}
        for f, s in changes:
            g, old = p.gbps[f], state.spine[f]
            for x in (p.up(f, old), p.dn(f, old)):
                delta[x] = delta.get(x, 0.0) - g
            for x in (p.up(f, s), p.dn(f, s)):
                delta[x] = delta.get(x, 0.0) + g
        if delta.get(link, 0.0) >= 0:
            return False
        load, cap = state.load, state.cap
        return all((load[x] + dx) / cap[x] < limit for x, dx in delta.items() if dx > 0)

    def _apply(self, changes: tuple[tuple[int, int], ...]) -> None:
        state, p, on = self.state, self.state.problem, self.on
        touched: set[int] = set()
        for f, s in changes:
            old = state.spine[f]
            for x in (p.up(f, old), p.dn(f, old)):
                on[x].discard(f)
                touched.add(x)
            state.unplace(f)
            state.place(f, s)
            for x in (p.up(f, s), p.dn(f, s)):
                on.setdefault(x, set()).add(f)
                touched.add(x)
        load, cap = state.load, state.cap
        for x in touched:
            heapq.heappush(self.heap, (-load[x] / cap[x], x))

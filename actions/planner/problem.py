"""A planning problem as flat int tables: the flows, their leaves and usable spines.

Built once per call from the v1 models, so the planner's loops touch lists of ints and
floats, never pydantic objects or string ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from schemas.files import Flows
from topology.model import Fabric, UnknownPortError, UnreachableError


@dataclass(frozen=True, slots=True)
class Problem:
    """Flows by int id ``f``: ports, leaves, demand and the spines they may use."""

    fabric: Fabric
    ids: tuple[str, ...]
    src: tuple[int, ...]
    dst: tuple[int, ...]
    src_leaf: tuple[int, ...]
    dst_leaf: tuple[int, ...]
    gbps: tuple[float, ...]
    # Usable spines of each flow (both its fabric links up), in spine order; () within a leaf.
    cands: tuple[tuple[int, ...], ...]
    down: frozenset[int]

    @property
    def size(self) -> int:
        """The number of flows."""
        return len(self.ids)

    def inter_leaf(self) -> list[int]:
        """The flows that cross a spine."""
        return [f for f, spines in enumerate(self.cands) if spines]

    def up(self, f: int, spine: int) -> int:
        """The directed link a flow takes from its source leaf to ``spine``."""
        return 2 * self.fabric.uplinks[self.src_leaf[f]][spine]

    def dn(self, f: int, spine: int) -> int:
        """The directed link a flow takes from ``spine`` to its destination leaf."""
        return 2 * self.fabric.uplinks[self.dst_leaf[f]][spine] + 1


def build_problem(fabric: Fabric, flows: Flows, down: Iterable[str] = ()) -> Problem:
    """The problem of a v1 flows file; its ``down`` and the extra ``down`` links are avoided."""
    items = flows.flows
    return build_problem_from(
        fabric,
        [flow.id for flow in items],
        [flow.src for flow in items],
        [flow.dst for flow in items],
        [flow.gbps for flow in items],
        (*flows.down, *down),
    )


def build_problem_from(
    fabric: Fabric,
    ids: Sequence[str],
    srcs: Sequence[str],
    dsts: Sequence[str],
    gbps: Sequence[float],
    down: Iterable[str] = (),
) -> Problem:
    """The problem of flows given as columns; raises `UnknownPortError`, `UnreachableError`."""
    links_down = frozenset(fabric.link_indices(down))
    index, port_leaf = fabric.port_index, fabric.port_leaf
    usable: dict[tuple[int, int], tuple[int, ...]] = {}
    src: list[int] = []
    dst: list[int] = []
    src_leaf: list[int] = []
    dst_leaf: list[int] = []
    cands: list[tuple[int, ...]] = []
    for flow, a, b in zip(ids, srcs, dsts, strict=True):
        s, d = index.get(a), index.get(b)
        if s is None or d is None:
            error = f"flow {flow}: unknown port {a if s is None else b!r}"
            raise UnknownPortError(error)
        if s in links_down or d in links_down:  # a port's cable is link number == port number
            error = f"flow {flow}: the cable of {a if s in links_down else b} is down"
            raise UnreachableError(error)
        la, lb = port_leaf[s], port_leaf[d]
        spines: tuple[int, ...] = ()
        if la != lb:
            key = (la, lb)
            found = usable.get(key)
            if found is None:
                found = fabric.usable_spines(la, lb, links_down)
                if not found:
                    cause = fabric.unreachable(s, d, down=bool(fabric.common_spines(la, lb)))
                    error = f"flow {flow}: {cause}"
                    raise UnreachableError(error)
                usable[key] = found
            spines = found
        src.append(s)
        dst.append(d)
        src_leaf.append(la)
        dst_leaf.append(lb)
        cands.append(spines)
    return Problem(
        fabric=fabric,
        ids=tuple(ids),
        src=tuple(src),
        dst=tuple(dst),
        src_leaf=tuple(src_leaf),
        dst_leaf=tuple(dst_leaf),
        gbps=tuple(gbps),
        cands=tuple(cands),
        down=links_down,
    )

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
    try:
        src = [index[a] for a in srcs]
        dst = [index[b] for b in dsts]
    except KeyError as missing:
        flow = next(f for f, a, b in zip(ids, srcs, dsts, strict=True) if missing.args[0] in (a, b))
        error = f"flow {flow}: unknown port {missing.args[0]!r}"
        raise UnknownPortError(error) from None
    if len(gbps) != len(src) or len(ids) != len(src):
        error = "flow columns differ in length"
        raise ValueError(error)
    if links_down:
        for flow, s, d in zip(ids, src, dst, strict=True):
            if s in links_down or d in links_down:  # a port's cable is link number == port
                port = fabric.port_ids[s if s in links_down else d]
                error = f"flow {flow}: the cable of {port} is down"
                raise UnreachableError(error)
    src_leaf = [port_leaf[s] for s in src]
    dst_leaf = [port_leaf[d] for d in dst]
    # Leaves with a down uplink: only their pairs need the (slower) filtered spine list.
    touched = {fabric.link_leaf[link] for link in links_down if link >= len(fabric.port_ids)}
    usable: dict[tuple[int, int], tuple[int, ...]] = {}
    plane_of, full, plane_spines = fabric.leaf_plane, fabric.full_mesh, fabric.plane_spines
    cands: list[tuple[int, ...]] = []
    append = cands.append
    for f, (la, lb) in enumerate(zip(src_leaf, dst_leaf, strict=True)):
        if la == lb:
            append(())
            continue
        plane = plane_of[la]
        if plane == plane_of[lb] and full[plane] and la not in touched and lb not in touched:
            append(plane_spines[plane])  # the common case, without a per-pair lookup
            continue
        found = usable.get((la, lb))
        if found is None:
            if la in touched or lb in touched:
                found = fabric.usable_spines(la, lb, links_down)
            else:
                found = fabric.common_spines(la, lb)
            if not found:
                common = fabric.common_spines(la, lb)
                cause = fabric.unreachable(src[f], dst[f], down=bool(common))
                error = f"flow {ids[f]}: {cause}"
                raise UnreachableError(error)
            usable[(la, lb)] = found
        append(found)
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

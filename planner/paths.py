"""A flow's v1 plan path from its spine, with the UDP source port that steers the hash to it."""

from __future__ import annotations

from pydantic import Field

from planner.problem import Problem
from schemas.files import PlanPath
from topology.ecmp import SPORT_MIN, Ecmp, SwitchHash


class RoutedPath(PlanPath):
    """A plan path and the UDP source port that makes the source leaf's hash choose its spine.

    On the wire it is a v1 plan path with one more key, ``sport`` (readers ignore unknown
    keys); `plan_json` writes it. Within one leaf there is no choice to steer: the first port
    of the dynamic range.
    """

    sport: int = Field(ge=0, le=65535, strict=True)


class PathMaker:
    """The paths of one problem's flows: new ones from a spine, old ones kept when still good."""

    __slots__ = ("ecmp", "problem")

    def __init__(self, problem: Problem, hash_model: SwitchHash | None) -> None:
        self.problem = problem
        self.ecmp = Ecmp(problem.fabric, hash_model) if hash_model is not None else None

    def keeps(self, f: int, spine: int, old: PlanPath) -> bool:
        """Whether flow ``f``'s previous path (on the same spine) can be reused as it is.

        Without a hash model only a plain path can; with one only a routed path, and only if
        the hash still lands on the same spine (a down link may have shrunk the ECMP group).
        """
        if self.ecmp is None:
            return type(old) is PlanPath
        if not isinstance(old, RoutedPath):
            return False
        p = self.problem
        return spine < 0 or self.ecmp.choose(p.src[f], p.dst[f], old.sport, p.down) == spine

    def make(self, f: int, spine: int) -> PlanPath:
        """Flow ``f``'s path through ``spine`` (-1: within one leaf)."""
        p = self.problem
        fabric = p.fabric
        src, dst = fabric.port_ids[p.src[f]], fabric.port_ids[p.dst[f]]
        via: str | None
        links: tuple[str, ...]
        if spine < 0:
            via, links = None, (src, dst)
        else:
            up_a, up_b = fabric.uplinks[p.src_leaf[f]], fabric.uplinks[p.dst_leaf[f]]
            names = fabric.link_ids
            via, links = fabric.spines[spine], (src, names[up_a[spine]], names[up_b[spine]], dst)
        if self.ecmp is None:
            return PlanPath(flow=p.ids[f], via=via, links=links)
        sport = SPORT_MIN
        if spine >= 0:
            sport = self.ecmp.sport_for(p.src[f], p.dst[f], spine, p.down, members=p.cands[f])
        return RoutedPath(flow=p.ids[f], via=via, links=links, sport=sport)

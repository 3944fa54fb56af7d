"""Edge colouring of bipartite multigraphs: flows as edges, leaves as vertices, spines as colours.

König's theorem: a bipartite multigraph of maximum degree ``k`` has a proper edge colouring
with ``k`` colours. Colouring edge by edge, a conflict (colour ``a`` free at ``u`` but not at
``v``, ``b`` free at ``v`` but not at ``u``) is resolved by swapping ``a`` and ``b`` along the
alternating path that starts at ``v``; in a bipartite graph that path never reaches ``u``, so
``a`` becomes free at both ends (a Kempe chain).

With more edges at a vertex than colours, the vertex is split into ``ceil(d / k)`` parts of at
most ``k`` edges each before colouring; every colour then appears at most ``ceil(d / k)``
times at the vertex, the best any assignment can do (pigeonhole).

A leaf whose link to a spine is down (or missing) must not see that colour. Its parts are
then made smaller, ``k - f`` edges for ``f`` forbidden colours, so each part keeps a free
allowed colour; after colouring, an edge on a forbidden colour at part ``x`` takes a free
allowed colour ``a`` of ``x`` by swapping ``a`` with its colour along the alternating path
from ``x``, when no edge of that path lands on a colour forbidden at one of its ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

NO_FORBIDDEN: Mapping[int, Set[int]] = {}


def colour_edges(us: Sequence[int], vs: Sequence[int], colours: int) -> list[int]:
    """A proper colouring (colour per edge) of a bipartite multigraph of degree <= colours.

    ``us[e]`` and ``vs[e]`` are the two ends of edge ``e``, numbered per side from 0.
    Raises `ValueError` when a vertex has more edges than colours.
    """
    return _Colouring(us, vs, colours).colour


def colour_balanced(
    us: Sequence[int],
    vs: Sequence[int],
    colours: int,
    forbid_u: Mapping[int, Set[int]] = NO_FORBIDDEN,
    forbid_v: Mapping[int, Set[int]] = NO_FORBIDDEN,
) -> list[int]:
    """A colouring where a vertex of degree d sees each colour at most ceil(d / (k - f)) times.

    ``forbid_u[u]`` (``forbid_v[v]``) are colours vertex ``u`` (``v``) should not see, ``f`` of
    them. Best effort for those: an edge may be left on a forbidden colour; the caller checks.
    """
    k = colours
    split_u, owner_u = _split(us, k, forbid_u)
    split_v, owner_v = _split(vs, k, forbid_v)
    colouring = _Colouring(split_u, split_v, k)
    if forbid_u or forbid_v:
        colouring.repair_forbidden(owner_u, owner_v, forbid_u, forbid_v)
    return colouring.colour


def _split(
    ends: Sequence[int], k: int, forbid: Mapping[int, Set[int]]
) -> tuple[list[int], list[int]]:
    """Renumber each vertex's edges into parts of at most k - f edges; parts' owners."""
    seen: dict[int, int] = {}
    part: dict[tuple[int, int], int] = {}
    owner: list[int] = []
    out: list[int] = []
    for vertex in ends:
        count = seen.get(vertex, 0)
        seen[vertex] = count + 1
        size = max(1, k - len(forbid.get(vertex, ())))
        key = (vertex, count // size)
        number = part.get(key)
        if number is None:
            number = len(part)
            part[key] = number
            owner.append(vertex)
        out.append(number)
    return out, owner


class _Colouring:
    """The colour of every edge and, per vertex, its edge of each colour (-1: free)."""

    def __init__(self, us: Sequence[int], vs: Sequence[int], k: int) -> None:
        self.us, self.vs, self.k = us, vs, k
        self.at_u: list[list[int]] = [[-1] * k for _ in range(max(us, default=-1) + 1)]
        self.at_v: list[list[int]] = [[-1] * k for _ in range(max(vs, default=-1) + 1)]
        self.colour = [-1] * len(us)
        at_u, at_v = self.at_u, self.at_v
        for e in range(len(us)):
            row_u, row_v = at_u[us[e]], at_v[vs[e]]
            # Start the search at a rotating colour: ties spread over the spines instead of
            # piling every lightly loaded leaf onto spine 0.
            a = _free(row_u, e % k)
            if row_v[a] >= 0:
                b = _free(row_v, e % k)
                if row_u[b] < 0:
                    a = b
                else:
                    self._swap(self._path(vs[e], False, a, b), a, b)
            self._set(e, a)

    def _set(self, e: int, c: int) -> None:
        self.colour[e] = c
        self.at_u[self.us[e]][c] = e
        self.at_v[self.vs[e]][c] = e

    def _path(self, start: int, on_u: bool, a: int, b: int) -> list[int]:
        """The edges of the path from ``start`` that alternates colours a, b, a, ..."""
        path: list[int] = []
        node, want = start, a
        while True:
            e = self.at_u[node][want] if on_u else self.at_v[node][want]
            if e < 0:
                return path
            path.append(e)
            node = self.vs[e] if on_u else self.us[e]
            on_u = not on_u
            want = b if want == a else a

    def _swap(self, path: list[int], a: int, b: int) -> None:
        for e in path:
            self.at_u[self.us[e]][self.colour[e]] = -1
            self.at_v[self.vs[e]][self.colour[e]] = -1
        for e in path:
            self._set(e, b if self.colour[e] == a else a)

    def repair_forbidden(
        self,
        owner_u: Sequence[int],
        owner_v: Sequence[int],
        forbid_u: Mapping[int, Set[int]],
        forbid_v: Mapping[int, Set[int]],
    ) -> None:
        """Move edges off colours forbidden at an end, by Kempe swaps that add no new misfit."""

        def allowed(e: int, c: int) -> bool:
            return c not in forbid_u.get(owner_u[self.us[e]], ()) and c not in forbid_v.get(
                owner_v[self.vs[e]], ()
            )

        progress = True
        while progress:
            progress = False
            for e, c in enumerate(self.colour):
                if allowed(e, c):
                    continue
                bad_at_u = c in forbid_u.get(owner_u[self.us[e]], ())
                node = self.us[e] if bad_at_u else self.vs[e]
                row = self.at_u[node] if bad_at_u else self.at_v[node]
                forbidden = (forbid_u if bad_at_u else forbid_v).get(
                    (owner_u if bad_at_u else owner_v)[node], ()
                )
                for a in range(self.k):
                    if row[a] >= 0 or a in forbidden:
                        continue
                    path = self._path(node, bad_at_u, c, a)
                    if all(allowed(x, a if self.colour[x] == c else c) for x in path):
                        self._swap(path, c, a)
                        progress = True
                        break


def _free(row: list[int], start: int) -> int:
    """The first free colour at or after ``start``, wrapping around."""
    try:
        return row.index(-1, start)
    except ValueError:
        pass
    try:
        return row.index(-1, 0, start)
    except ValueError:
        error = "a vertex has more edges than colours"
        raise ValueError(error) from None

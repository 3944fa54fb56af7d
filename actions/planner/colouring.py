"""Edge colouring of bipartite multigraphs: flows as edges, leaves as vertices, spines as colours.

König's theorem: a bipartite multigraph of maximum degree ``k`` has a proper edge colouring
with ``k`` colours. Colouring edge by edge, a conflict (colour ``a`` free at ``u`` but not at
``v``, ``b`` free at ``v`` but not at ``u``) is resolved by swapping ``a`` and ``b`` along the
alternating path that starts at ``v``; in a bipartite graph that path never reaches ``u``, so
``a`` becomes free at both ends (a Kempe chain).

With more edges at a vertex than colours, the vertex is split into ``ceil(d / k)`` parts of at
most ``k`` edges each before colouring; every colour then appears at most ``ceil(d / k)``
times at the vertex, the best any assignment can do (pigeonhole).
"""

from __future__ import annotations

from collections.abc import Sequence


def colour_edges(us: Sequence[int], vs: Sequence[int], colours: int) -> list[int]:
    """A proper colouring (colour per edge) of a bipartite multigraph of degree <= colours.

    ``us[e]`` and ``vs[e]`` are the two ends of edge ``e``, numbered per side from 0.
    Raises `ValueError` when a vertex has more edges than colours.
    """
    edges = len(us)
    k = colours
    at_u: list[list[int]] = [[-1] * k for _ in range(max(us, default=-1) + 1)]
    at_v: list[list[int]] = [[-1] * k for _ in range(max(vs, default=-1) + 1)]
    colour = [-1] * edges
    for e in range(edges):
        u, v = us[e], vs[e]
        row_u, row_v = at_u[u], at_v[v]
        # Start the search at a rotating colour: ties spread over the spines instead of
        # piling every lightly loaded leaf onto spine 0.
        a = _free(row_u, e % k)
        if row_v[a] >= 0:
            b = _free(row_v, e % k)
            if row_u[b] < 0:
                a = b
            else:
                _flip(at_u, at_v, colour, us, vs, v, a, b)
        colour[e] = a
        row_u[a] = e
        row_v[a] = e
    return colour


def colour_balanced(us: Sequence[int], vs: Sequence[int], colours: int) -> list[int]:
    """A colouring where a vertex of degree d sees each colour at most ceil(d / k) times."""
    k = colours
    split_u = _split(us, k)
    split_v = _split(vs, k)
    return colour_edges(split_u, split_v, k)


def _split(ends: Sequence[int], k: int) -> list[int]:
    """Renumber each vertex's edges into parts of at most k edges each."""
    seen: dict[int, int] = {}
    part: dict[tuple[int, int], int] = {}
    out: list[int] = []
    for vertex in ends:
        count = seen.get(vertex, 0)
        seen[vertex] = count + 1
        key = (vertex, count // k)
        number = part.get(key)
        if number is None:
            number = len(part)
            part[key] = number
        out.append(number)
    return out


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


def _flip(
    at_u: list[list[int]],
    at_v: list[list[int]],
    colour: list[int],
    us: Sequence[int],
    vs: Sequence[int],
    v: int,
    a: int,
    b: int,
) -> None:
    """Swap colours a and b along the alternating path from ``v`` (which starts with a)."""
    path: list[int] = []
    node, on_v, want = v, True, a
    while True:
        e = at_v[node][want] if on_v else at_u[node][want]
        if e < 0:
            break
        path.append(e)
        node = us[e] if on_v else vs[e]
        on_v = not on_v
        want = b if want == a else a
    for e in path:
        at_u[us[e]][colour[e]] = -1
        at_v[vs[e]][colour[e]] = -1
    for e in path:
        c = b if colour[e] == a else a
        colour[e] = c
        at_u[us[e]][c] = e
        at_v[vs[e]][c] = e

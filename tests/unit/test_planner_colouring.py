from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.colouring import colour_balanced, colour_edges

edges = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=120)


@settings(max_examples=300, deadline=None)
@given(edges, st.integers(1, 10))
def test_balanced_colouring_puts_at_most_ceil_degree_over_k_per_colour(
    pairs: list[tuple[int, int]], k: int
) -> None:
    us, vs = [u for u, _ in pairs], [v for _, v in pairs]
    colours = colour_balanced(us, vs, k)
    assert all(0 <= c < k for c in colours)
    for side in (us, vs):
        degree = Counter(side)
        for (vertex, _), count in Counter(zip(side, colours, strict=True)).items():
            assert count <= math.ceil(degree[vertex] / k)


@settings(max_examples=300, deadline=None)
@given(edges)
def test_konig_colouring_with_max_degree_colours_is_proper(pairs: list[tuple[int, int]]) -> None:
    us, vs = [u for u, _ in pairs], [v for _, v in pairs]
    k = max([*Counter(us).values(), *Counter(vs).values()], default=1)
    colours = colour_edges(us, vs, k)
    assert len(set(zip(us, colours, strict=True))) == len(pairs)  # no colour twice at a u
    assert len(set(zip(vs, colours, strict=True))) == len(pairs)  # nor at a v


def test_needs_kempe_chains() -> None:
    # Greedy first-fit fails here; the alternating-path swap finds the 2-colouring.
    us = [0, 1, 1, 0]
    vs = [0, 1, 0, 1]
    colours = colour_edges(us, vs, 2)
    assert len(set(zip(us, colours, strict=True))) == 4
    assert len(set(zip(vs, colours, strict=True))) == 4


def test_too_few_colours_is_an_error() -> None:
    with pytest.raises(ValueError, match="more edges than colours"):
        colour_edges([0, 0, 0], [0, 1, 2], 2)


@settings(max_examples=300, deadline=None)
@given(
    edges,
    st.integers(2, 8),
    st.dictionaries(st.integers(0, 7), st.integers(0, 7), max_size=4),
)
def test_forbidden_colours_shrink_the_parts(
    pairs: list[tuple[int, int]], k: int, down: dict[int, int]
) -> None:
    # One forbidden colour per listed vertex, on both sides, like a leaf's down uplink.
    forbid = {vertex: {colour % k} for vertex, colour in down.items()}
    pairs = [(u, v) for u, v in pairs if len(forbid.get(u, set()) | forbid.get(v, set())) < k]
    us, vs = [u for u, _ in pairs], [v for _, v in pairs]
    colours = colour_balanced(us, vs, k, forbid, forbid)
    for side in (us, vs):
        degree = Counter(side)
        for (vertex, _), count in Counter(zip(side, colours, strict=True)).items():
            assert count <= math.ceil(degree[vertex] / (k - len(forbid.get(vertex, ()))))


def test_a_down_link_is_avoided_by_kempe_swaps() -> None:
    # Leaf 0 lost spine 0 (colour 0); greedy colouring would put its first edge there.
    us, vs = [0, 0, 1, 1], [0, 1, 0, 1]
    colours = colour_balanced(us, vs, 3, {0: {0}}, {})
    assert 0 not in {c for u, c in zip(us, colours, strict=True) if u == 0}
    assert len(set(zip(us, colours, strict=True))) == 4
    assert len(set(zip(vs, colours, strict=True))) == 4

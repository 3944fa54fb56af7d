"""Hypothesis strategies for hostile input: the values every entry point must survive.

Malformed JSON, wrong types, huge arrays, NaN and infinities, integers past 64 bits, odd
unicode (control characters, right-to-left marks, astral planes, lone surrogates where the
carrier allows them), truncated documents and oversized ones. Shared by the fuzz tests of
each decoder; the coverage-guided harnesses under ``tests/fuzz`` start from the same shapes.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import strategies as st

# Characters that break naive parsers and printers: NUL, newlines, RTL override, BOM, emoji.
ODD_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(["\x00", "\n", "\r", "\t", "\u202e", "\ufeff", "\U0001f525", "\\", '"']),
        st.characters(codec="utf-8"),
    ),
    max_size=30,
)
EDGE_NUMBERS = st.sampled_from(
    [
        0,
        -1,
        1,
        2**31,
        2**63 - 1,
        2**63,
        -(2**63) - 1,
        2**64,
        10**30,
        1.5,
        -0.0,
        1e308,
        float("nan"),
        float("inf"),
        float("-inf"),
        True,
        False,
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    EDGE_NUMBERS,
    ODD_TEXT,
)


@st.composite
def huge_lists(draw: st.DrawFn, element: st.SearchStrategy[Any] = SCALARS) -> list[Any]:
    """A list of one repeated value, from empty to a hundred thousand items."""
    size = draw(st.sampled_from([0, 1, 1_000, 10_001, 100_000]))
    return [draw(element)] * size


VALUES: st.SearchStrategy[Any] = st.recursive(
    st.one_of(SCALARS, huge_lists()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(ODD_TEXT, inner, max_size=4)
    ),
    max_leaves=12,
)


def json_text(value: Any) -> str:
    """Python's JSON of ``value``: writes NaN/Infinity literals and huge integers, as a
    careless producer would (orjson refuses them, which is the point)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=True)


@st.composite
def damaged(draw: st.DrawFn, good: bytes) -> bytes:
    """``good`` truncated, with a byte flipped, a chunk doubled, or garbage appended."""
    how = draw(st.sampled_from(["truncate", "flip", "double", "append", "nul"]))
    if not good:
        return draw(st.binary(max_size=64))
    at = draw(st.integers(0, len(good) - 1))
    if how == "truncate":
        return good[:at]
    if how == "flip":
        return good[:at] + bytes([good[at] ^ draw(st.integers(1, 255))]) + good[at + 1 :]
    if how == "double":
        return good[:at] + good[at:] + good[at:]
    if how == "nul":
        return good[:at] + b"\x00" + good[at:]
    return good + draw(st.binary(min_size=1, max_size=32))


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is an int or a finite float (bool excluded)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.base import C4Model
from schemas.codec import Rejection, decode, encode
from tests.contract import contract_examples

ids = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FFF, exclude_characters='"\\'),
    min_size=1,
    max_size=24,
)
nanos = st.integers(min_value=0, max_value=2**63 - 1)
counts = st.integers(min_value=0, max_value=2**40)
op_names = st.sampled_from(
    ["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "barrier"]
)


@st.composite
def collectives(draw: st.DrawFn) -> dict[str, Any]:
    comm_size = draw(st.integers(min_value=3, max_value=4096))
    rank = draw(st.integers(min_value=0, max_value=comm_size - 1))
    n = draw(st.integers(min_value=0, max_value=20))
    enters = draw(st.lists(st.integers(0, 2**62), min_size=n, max_size=n))
    ends = [draw(st.one_of(st.none(), st.integers(enter, 2**62))) for enter in enters]
    message: dict[str, Any] = {
        "v": 1,
        "kind": "collective",
        "job": draw(ids),
        "comm": draw(ids),
        "comm_size": comm_size,
        "rank": rank,
        "global_rank": draw(counts),
        "ts_ns": draw(nanos),
        "ops": {
            "seq": draw(st.lists(counts, min_size=n, max_size=n)),
            "op": draw(st.lists(op_names, min_size=n, max_size=n)),
            "bytes": draw(st.lists(counts, min_size=n, max_size=n)),
            "enter_ns": enters,
            "end_ns": ends,
        },
    }
    if draw(st.booleans()):
        message["node"] = draw(ids)
        message["gpu"] = draw(st.integers(0, 15))
    if draw(st.booleans()):
        m = draw(st.integers(0, 8))
        peers = [
            p
            for p in draw(st.lists(st.integers(0, comm_size - 1), min_size=m, max_size=m))
            if p != rank
        ]
        message["conns"] = {
            "peer": peers,
            "port": [draw(ids) for _ in peers],
            "bytes": [draw(counts) for _ in peers],
            "busy_ns": [draw(counts) for _ in peers],
        }
    return message


@st.composite
def diagnoses(draw: st.DrawFn) -> dict[str, Any]:
    onset = draw(st.integers(0, 2**62))
    return {
        "v": 1,
        "kind": "diagnosis",
        "id": draw(ids),
        "job": draw(st.one_of(st.none(), ids)),
        "state": draw(st.sampled_from(["firing", "resolved"])),
        "class": draw(st.sampled_from(["comm_hang", "noncomm_slow", "link_down", "node_down"])),
        "onset_ns": onset,
        "ts_ns": draw(st.integers(onset, 2**63 - 1)),
        "suspects": [
            {
                "type": draw(st.sampled_from(["gpu", "node", "port", "link", "switch", "rank"])),
                "id": draw(ids),
                "score": draw(st.floats(0, 1)),
            }
            for _ in range(draw(st.integers(0, 4)))
        ],
        "evidence": draw(st.dictionaries(ids, st.one_of(st.integers(-10, 10), ids), max_size=4)),
    }


@st.composite
def links(draw: st.DrawFn) -> dict[str, Any]:
    names = ["tx_bytes", "rx_bytes", "symbol_err", "link_down", "cnp_sent", "timeout_retrans"]
    return {
        "v": 1,
        "kind": "link",
        "node": draw(ids),
        "port": draw(ids),
        "ts_ns": draw(nanos),
        "state": draw(st.sampled_from(["up", "down"])),
        "gbps": draw(st.floats(0, 800, allow_nan=False)),
        "counters": {name: draw(counts) for name in names if draw(st.booleans())},
    }


def assert_round_trips(obj: dict[str, Any]) -> None:
    model = decode(orjson.dumps(obj))
    assert isinstance(model, C4Model), model
    wire = encode(model)
    again = decode(wire)
    assert again == model
    assert isinstance(again, C4Model)
    assert encode(again) == wire


@settings(max_examples=300)
@given(collectives())
def test_collective_round_trips(obj: dict[str, Any]) -> None:
    assert_round_trips(obj)


@settings(max_examples=200)
@given(st.one_of(diagnoses(), links()))
def test_diagnosis_and_link_round_trip(obj: dict[str, Any]) -> None:
    assert_round_trips(obj)


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300)
@given(st.sampled_from(sorted(contract_examples())), st.text(max_size=12), json_values)
def test_replacing_any_field_never_raises(kind: str, field: str, value: Any) -> None:
    obj = dict(contract_examples()[kind])
    obj[field if field else "ops"] = value
    result = decode(orjson.dumps(obj))
    assert isinstance(result, C4Model | Rejection)
    if isinstance(result, Rejection):
        assert result.reason and "\n" not in result.reason


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    result = decode(data)
    assert isinstance(result, C4Model | Rejection)

"""The decode fast path agrees with the models on valid and broken documents alike."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, get_type_hints

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.base import C4Model
from schemas.codec import MODELS, decode, encode
from schemas.fastpath import _Collective, _Conns, _Counters, _Link, _Links, _Ops, decode_hot
from schemas.messages import Collective, Conns, Link, LinkCounters, Links, Ops
from simulator import scenario_from, simulate
from tests.unit.test_codec_properties import collectives, json_values, links


def slow(raw: bytes, kind: str) -> C4Model | None:
    """What the models say: the model, or None when they reject the document."""
    try:
        return MODELS[kind].model_validate(orjson.loads(raw))
    except (ValidationError, orjson.JSONDecodeError):
        return None


def assert_same_bytes(raw: bytes, kind: str) -> C4Model | None:
    """The fast path's answer, after checking it against the models' own."""
    fast = decode_hot(raw, kind)
    expected = slow(raw, kind)
    if fast is not None:
        assert expected is not None, f"the fast path let an invalid document through: {raw!r}"
        assert fast == expected
        assert type(fast.model_dump()) is dict
        assert_built_alike(fast, expected)
        assert encode(fast) == encode(expected)
    return fast


def assert_built_alike(fast: Any, expected: Any) -> None:
    """``fast`` is the model validation built, down to what ``==`` does not compare: the
    fields set (a field given as null included), the order of ``__dict__`` (model_dump's
    and encode's order) and pydantic's own slots; nested models alike."""
    assert type(fast) is type(expected)
    if not isinstance(expected, C4Model):
        assert fast == expected
        return
    assert fast.model_fields_set == expected.model_fields_set
    assert type(fast.model_fields_set) is set
    assert list(fast.__dict__) == list(expected.__dict__)
    assert fast.__pydantic_extra__ == expected.__pydantic_extra__
    assert fast.__pydantic_private__ == expected.__pydantic_private__
    for name, value in expected.__dict__.items():
        assert_built_alike(fast.__dict__[name], value)


def assert_same(obj: dict[str, Any], kind: str | None = None) -> C4Model | None:
    return assert_same_bytes(orjson.dumps(obj), kind or obj["kind"])


@st.composite
def pairs(draw: st.DrawFn) -> dict[str, Any]:
    """A collective of a two-member communicator: send and recv allowed."""
    message = draw(collectives())
    message["comm_size"] = 2
    message["rank"] = draw(st.integers(0, 1))
    n = len(message["ops"]["seq"])
    message["ops"]["op"] = draw(st.lists(st.sampled_from(["send", "recv"]), min_size=n, max_size=n))
    message.pop("conns", None)
    if draw(st.booleans()):
        peer = 1 - message["rank"]
        message["conns"] = {"peer": [peer], "port": ["mlx5_0:1"], "bytes": [1], "busy_ns": [2]}
    return message


documents = st.one_of(collectives(), pairs(), links())


def _places(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a document: the paths of its keys and array elements."""
    found = [path] if path else []
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _places(value, (*path, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            found += _places(value, (*path, index))
    return found


# Near misses of the checks: the values a strict validator must tell apart.
NEAR_MISSES: list[Any] = [
    *(True, False, None, -1, 0, 1, 2, 2**64 - 1, 1.0, 0.5, -0.5, -0.0, 1e308, 200),
    *("", "1", "x" * 256, "x" * 257, "\u00e9" * 256, [], [None], [-1], {}, {"seq": []}),
    *("send", "recv", "allreduce", "alltoall ", "up", "down", "Up"),
]
tricky = st.one_of(json_values, st.sampled_from(NEAR_MISSES), st.integers(-(2**63), 2**64 - 1))


def mutated(draw: st.DrawFn, message: Any, extra_keys: list[str]) -> Any:
    """``message`` with one, two or three places replaced, removed or added (in place)."""
    for _ in range(draw(st.integers(1, 3))):
        places = _places(message)
        path = draw(st.sampled_from(places))
        parent: Any = message
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        # A copy: a near miss ([], {}) put in and then changed by a later step would change
        # NEAR_MISSES itself, and hypothesis would replay a different document.
        value = copy.deepcopy(draw(tricky))
        if action == "replace" or (action == "remove" and isinstance(parent, list)):
            parent[last] = value
        elif action == "remove":
            del parent[last]
        elif isinstance(parent, list):
            parent.append(value)
        else:
            parent[draw(st.sampled_from(extra_keys))] = value
    return message


@st.composite
def broken(draw: st.DrawFn) -> dict[str, Any]:
    """A valid document with one, two or three places replaced, removed or added."""
    message = mutated(draw, draw(documents), ["extra", "node", "gpu", "conns", "gbps"])
    message["v"], message["kind"] = 1, message.get("kind", "collective")
    if message["kind"] not in ("collective", "link"):
        message["kind"] = "collective"
    return message


@settings(max_examples=500)
@given(documents)
def test_valid_documents_take_the_fast_path_to_the_same_model(obj: dict[str, Any]) -> None:
    assert assert_same(obj) is not None, obj


@settings(max_examples=3000)
@given(broken())
def test_the_fast_path_lets_no_broken_document_through(obj: dict[str, Any]) -> None:
    assert_same(obj)


EXAMPLES: list[dict[str, Any]] = [
    {
        "v": 1,
        "kind": "collective",
        "job": "job-1",
        "comm": "dp-0",
        "comm_size": 4,
        "rank": 1,
        "global_rank": 9,
        "node": "node-001",
        "gpu": 1,
        "ts_ns": 10,
        "ops": {
            "seq": [7, 8],
            "op": ["allreduce", "allgather"],
            "bytes": [8, 16],
            "enter_ns": [5, 6],
            "end_ns": [6, None],
        },
        "conns": {
            "peer": [0, 2],
            "port": ["mlx5_0:1", "mlx5_0:1"],
            "bytes": [4, 4],
            "busy_ns": [2, 3],
        },
    },
    {
        "v": 1,
        "kind": "link",
        "node": "node-001",
        "port": "mlx5_0:1",
        "ts_ns": 10,
        "state": "up",
        "gbps": 200.0,
        "counters": {"symbol_err": 3, "link_down": 0, "timeout_retrans": 1},
    },
]


def near_misses_of(example: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Copies of ``example`` with each place set to each near miss, and each key removed."""
    for path in _places(example):
        for value in NEAR_MISSES:
            obj = copy.deepcopy(example)
            parent: Any = obj
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = value
            yield obj
            if isinstance(parent, dict):
                del parent[path[-1]]
                yield obj


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: str(e["kind"]))
def test_every_place_of_a_message_with_every_near_miss(example: dict[str, Any]) -> None:
    assert assert_same(example) is not None
    for obj in near_misses_of(example):
        assert_same(obj, example["kind"])


def one_op(name: str, end: int | None) -> dict[str, list[Any]]:
    return {"seq": [1], "op": [name], "bytes": [1], "enter_ns": [5], "end_ns": [end]}


def a_collective() -> dict[str, Any]:
    """A valid one-operation collective message of a 4-member group, to change per case."""
    return {
        "v": 1,
        "kind": "collective",
        "job": "job-1",
        "comm": "c",
        "comm_size": 4,
        "rank": 0,
        "global_rank": 0,
        "ts_ns": 10,
        "ops": {"seq": [1], "op": ["allreduce"], "bytes": [8], "enter_ns": [5], "end_ns": [6]},
    }


@pytest.mark.parametrize(
    ("change", "fast"),
    [
        ({}, True),
        ({"rank": True}, False),  # strict: a boolean is not a rank
        ({"rank": 4}, False),  # rank < comm_size
        ({"comm_size": 2}, True),
        ({"ops": one_op("allreduce", 4)}, False),  # ends before it entered
        ({"ops": one_op("send", None)}, False),  # send/recv only in a two-member communicator
        ({"ops": one_op("send", None), "comm_size": 2}, True),
        ({"ops": one_op("recv", None), "comm_size": 1}, False),
        ({"conns": {"peer": [0], "port": ["p"], "bytes": [1], "busy_ns": [1]}}, False),  # itself
        ({"job": ""}, False),
        ({"gpu": None, "node": None}, True),
        ({"surplus": {"ignored": True}}, True),
    ],
)
def test_the_contract_rules_hold_on_the_fast_path(change: dict[str, Any], fast: bool) -> None:
    assert (assert_same(a_collective() | change) is not None) is fast


def test_every_simulated_collective_and_link_takes_the_fast_path() -> None:
    scenario = scenario_from(
        {
            "seed": 3,
            "duration_s": 6,
            "jobs": [{"id": "job-1", "ranks": 16, "parallel": {"tp": 4, "pp": 2}}],
        }
    )
    messages = list(simulate(None, scenario))
    hot = [m for m in messages if getattr(m, "kind", "") in ("collective", "link")]
    assert {getattr(m, "kind", "") for m in hot} == {"collective", "link"}
    for message in hot:
        wire = encode(message)
        assert assert_same_bytes(wire, message.kind) is not None, wire  # type: ignore[attr-defined]
        assert decode(wire) == message


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v":1,"kind":"link","node":"n","port":"p","ts_ns":1,"state":"up","counters":{},"ts_ns":-1}',
        b'{"v":1,"kind":"link","node":"n","port":"p","ts_ns":18446744073709551616,"state":"up","counters":{}}',
        b'{"v":1,"kind":"link","node":"n","port":"p","ts_ns":1,"state":"up","counters":{},"gbps":1e400}',
        b'{"v":1,"kind":"link","node":"\\ud800","port":"p","ts_ns":1,"state":"up","counters":{}}',
        b'{"v":1,"kind":"link","node":"n","port":"p","ts_ns":1,"state":"up","counters":{}} x',
        b'{"v":1,"kind":"link","node":"n","port":"p","ts_ns":1,"state":"up","counters":{"symbol_err":null}}',
        b'{"v":1,"kind":"link","node":"\xff","port":"p","ts_ns":1,"state":"up","counters":{}}',
    ],
)
def test_json_edge_cases_are_read_as_orjson_reads_them(raw: bytes) -> None:
    assert_same_bytes(raw, "link")
    assert_same_bytes(raw, "collective")


@pytest.mark.parametrize(
    ("enters", "ends", "fast"),
    [
        ([5, 5, 5], [None, 5, 6], True),
        ([5, 5, 5], [None, 4, 6], False),  # past a null end, a later end still counts
        ([5, 5, 5], [6, None, 4], False),
        ([5, 5, 5], [4, None, None], False),
        ([5, 5, 5], [None, None, None], True),
        ([5, 5], [6, 5], True),
        ([5, 5], [6, 4], False),
    ],
)
def test_an_end_before_its_enter_is_caught_around_null_ends(
    enters: list[int], ends: list[int | None], fast: bool
) -> None:
    n = len(enters)
    ops = {"seq": [1] * n, "op": ["allreduce"] * n, "bytes": [8] * n}
    obj = a_collective() | {"ops": ops | {"enter_ns": enters, "end_ns": ends}}
    assert (assert_same(obj) is not None) is fast


@pytest.mark.parametrize(
    ("wire", "model"),
    [
        (_Ops, Ops),
        (_Conns, Conns),
        (_Collective, Collective),
        (_Link, Link),
        (_Links, Links),
    ],
)
def test_the_wire_structs_have_the_models_fields(wire: Any, model: type[C4Model]) -> None:
    # A field added to a model and not here would be dropped on the fast path, silently.
    tag = {wire.__struct_config__.tag_field} - {None}
    assert {*wire.__struct_fields__, *tag} == set(model.model_fields)


def test_the_wire_counters_are_the_models_counters() -> None:
    # Counters missing here would be ignored by msgspec (unknown keys) and left None.
    assert list(get_type_hints(_Counters)) == list(LinkCounters.model_fields)
    assert not _Counters.__required_keys__

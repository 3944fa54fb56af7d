"""Fuzzing the documents c4 reads: v1 messages anywhere deep, topology/flows/plan files, the
action worker's configuration, webhook signatures.

Every input is either accepted (and then usable: it encodes again, a topology builds its
fabric, a plan is made) or rejected with a typed, one-line reason; nothing else escapes.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actions.config import ConfigError, WorkerConfig, load_config, parse_config
from actions.webhook import sign, verify
from c4.inputs import InputError, load_document
from planner import plan, plan_json
from schemas.base import C4Model
from schemas.codec import MAX_MESSAGE_BYTES, RejectCode, Rejection, decode, encode
from schemas.files import Flows, Plan, Topology
from tests.contract import contract_examples
from tests.hostile import ODD_TEXT, VALUES, damaged, json_text
from topology import TopologyError
from topology.model import Fabric

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document (keys and list indices)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += paths_of(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value[:3]):
            found += paths_of(inner, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, kinds: list[str]) -> tuple[str, Any]:
    """A contract example with one to three values anywhere in it replaced, or removed."""
    kind = draw(st.sampled_from(kinds))
    document = copy.deepcopy(contract_examples()[kind])
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths_of(document)))
        if not path:
            document = draw(VALUES)
            break
        parent = document
        try:
            for part in path[:-1]:
                parent = parent[part]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(parent, dict) and draw(st.integers(0, 4)) == 0:
            parent.pop(path[-1], None)
        elif isinstance(parent, dict | list):
            parent[path[-1]] = draw(VALUES)
    return kind, document


def as_bytes(document: Any) -> bytes:
    """Python's JSON (NaN, Infinity, integers past 64 bits allowed), UTF-8 with surrogates."""
    return json_text(document).encode("utf-8", "surrogatepass")


def assert_typed(result: C4Model | Rejection) -> None:
    if isinstance(result, Rejection):
        assert isinstance(result.code, RejectCode)
        assert result.reason and "\n" not in result.reason
        return
    # Anything accepted is v1 wire again.
    assert decode(encode(result)) == result


MESSAGE_KINDS = [kind for kind in contract_examples() if kind not in ("topology", "flows", "plan")]


@FUZZ
@given(mutated(MESSAGE_KINDS), st.booleans())
def test_messages_mutated_anywhere_decode_or_reject(case: tuple[str, Any], by_topic: bool) -> None:
    kind, document = case
    result = decode(as_bytes(document), kind if by_topic else None)
    assert_typed(result)


@FUZZ
@given(
    st.sampled_from(MESSAGE_KINDS).flatmap(lambda k: damaged(orjson.dumps(contract_examples()[k])))
)
def test_truncated_and_garbled_messages_decode_or_reject(data: bytes) -> None:
    assert_typed(decode(data))


@pytest.mark.parametrize(
    "data",
    [
        b" " * (MAX_MESSAGE_BYTES + 1),
        b'{"v":1,"kind":"gpu","node":"' + b"x" * MAX_MESSAGE_BYTES + b'"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"v":1,"kind":"collective","ops":{"seq":[' + b"1," * 500_000 + b"1]}}",
    ],
    ids=["oversized blank", "oversized field", "deep nesting", "huge array"],
)
def test_oversized_and_deep_messages_are_typed_rejections(data: bytes) -> None:
    result = decode(data)
    assert isinstance(result, Rejection)
    assert_typed(result)
    if len(data) > MAX_MESSAGE_BYTES:
        assert result.code is RejectCode.TOO_LARGE


# --- topology, flows and plan files ------------------------------------------------------


@FUZZ
@given(mutated(["topology", "flows", "plan"]), st.booleans())
def test_v1_files_load_or_name_the_problem(
    tmp_path_factory: Any, case: tuple[str, Any], garble: bool
) -> None:
    kind, document = case
    path = tmp_path_factory.mktemp("files") / f"{kind}.json"
    raw = as_bytes(document)
    path.write_bytes(raw[: len(raw) // 2] if garble else raw)
    model = {"topology": Topology, "flows": Flows, "plan": Plan}[kind]
    try:
        loaded = load_document(str(path), kind, model)
    except InputError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error)
        assert error.exit_code == 1
        return
    assert isinstance(loaded, model)
    if isinstance(loaded, Topology):
        try:
            Fabric.from_topology(loaded)
        except TopologyError as error:
            assert "\n" not in str(error)


@FUZZ
@given(mutated(["topology"]), mutated(["flows"]))
def test_planning_hostile_files_plans_or_fails_with_a_topology_error(
    topology_case: tuple[str, Any], flows_case: tuple[str, Any]
) -> None:
    topology = decode(as_bytes(topology_case[1]), "topology")
    flows = decode(as_bytes(flows_case[1]), "flows")
    if not isinstance(topology, Topology) or not isinstance(flows, Flows):
        return
    try:
        result = plan(Fabric.from_topology(topology), flows)
    except TopologyError as error:
        assert str(error) and "\n" not in str(error)
        return
    # A plan is a v1 plan: one path per flow that could be routed.
    assert decode(plan_json(result), "plan") == result
    assert {path.flow for path in result.paths} <= {flow.id for flow in flows.flows}


# --- the action worker's configuration ---------------------------------------------------

GOOD_CONFIG: dict[str, Any] = {
    "policy": {
        "min_score": 0.5,
        "blast_radius": 4,
        "job_rate": {"actions": 4, "window_s": 3600},
        "classes": {"noncomm_hang": ["isolate", "restart", "alert"]},
    },
    "retry": {"tries": 5, "backoff_s": 0.5},
    "reroute": {"mode": "best", "hash": "crc32"},
    "launcher": {"command": ["launch", "{job}"], "webhook": {"url": "http://127.0.0.1:9/r"}},
    "receivers": [
        {"name": "ops", "url": "https://alerts.example/hook", "jobs": ["job-.*"], "secret_env": "S"}
    ],
}


@st.composite
def configs(draw: st.DrawFn) -> Any:
    document = copy.deepcopy(GOOD_CONFIG)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(paths_of(document)))
        if not path:
            return draw(VALUES)
        parent: Any = document
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict) and draw(st.booleans()):
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = draw(
                st.one_of(VALUES, st.sampled_from(["(", "[a-", "*", "x" * 5000, "nope"]))
            )
    return document


@FUZZ
@given(configs(), st.sampled_from([{"S": "k"}, {}, {"S": ""}]))
def test_worker_configuration_validates_or_names_the_field(
    config: Any, env: dict[str, str]
) -> None:
    try:
        parsed = parse_config(config, env) if isinstance(config, dict) else None
    except ConfigError as error:
        assert str(error) and "\n" not in str(error)
        return
    if parsed is not None:
        assert isinstance(parsed, WorkerConfig)
        # A secret is resolved from the environment and never shown.
        for receiver in parsed.receivers:
            assert "'k'" not in repr(receiver)


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=300),
        st.builds(lambda d: json_text(d).encode("utf-8", "surrogatepass"), configs()),
        st.builds(lambda d: yaml.safe_dump(d).encode(), st.just(GOOD_CONFIG)).flatmap(damaged),
        ODD_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
    ),
    st.sampled_from(["c.yaml", "c.yml", "c.json"]),
)
def test_worker_configuration_files_of_any_bytes(
    tmp_path_factory: Any, data: bytes, name: str
) -> None:
    path = tmp_path_factory.mktemp("config") / name
    path.write_bytes(data)
    try:
        config = load_config(path, {"S": "k"})
    except ConfigError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error)
        return
    assert isinstance(config, WorkerConfig)


def test_yaml_alias_bomb_is_a_config_error(tmp_path: Path) -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for previous, name in zip("abcdef", "bcdefg", strict=True):
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    path = tmp_path / "bomb.yaml"
    body = ["policy:", "  classes:", "    noncomm_hang: *g"]
    path.write_text("\n".join(["anchors:", *(f"  {x}" for x in levels), *body]) + "\n")
    with pytest.raises(ConfigError, match="bomb.yaml"):
        load_config(path, {})


# --- webhook signatures ------------------------------------------------------------------


@FUZZ
@given(
    st.binary(min_size=1, max_size=64),
    st.binary(max_size=2000),
    st.one_of(ODD_TEXT, st.binary(max_size=80)),
)
def test_signature_verifies_only_the_signed_body(secret: bytes, body: bytes, forged: Any) -> None:
    header = sign(secret, body)
    assert verify(secret, body, header)
    assert verify(secret, body, header.encode())
    assert not verify(secret + b"x", body, header)
    assert not verify(secret, body + b"\x00", header)
    # A forged or garbled header is False, never an exception (non-ASCII included).
    assert verify(secret, body, forged) is (forged in (header, header.encode()))

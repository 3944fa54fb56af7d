"""A table of invalid inputs, each with the rejection code and reason it must get."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import orjson

from schemas.codec import RejectCode
from tests.contract import contract_examples

_DELETE = object()


@dataclass(frozen=True)
class Case:
    """One invalid input: what it is, the expected code, and text the reason must contain."""

    name: str
    data: bytes
    code: RejectCode
    reason: str
    # True when JSON Schema cannot state the rule: cross-field rules (listed under x-c4-rules)
    # and integral floats, which JSON Schema counts as integers (3.0 is rejected, 3 is not).
    beyond_schema: bool = False


def _set(kind: str, path: str, value: Any) -> bytes:
    obj = copy.deepcopy(contract_examples()[kind])
    parts = path.split(".")
    target = obj
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    if value is _DELETE:
        del target[int(last) if last.isdigit() else last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return orjson.dumps(obj)


def _drop(kind: str, path: str) -> bytes:
    return _set(kind, path, _DELETE)


R = RejectCode
T, V, M, X = R.WRONG_TYPE, R.BAD_VALUE, R.MISSING_FIELD, R.INCONSISTENT


def invalid_cases() -> list[Case]:
    """Every case of the table (built lazily: it reads the contract's examples)."""
    c = "collective"
    return [
        Case("not json", b'{"v": 1,', R.INVALID_JSON, "invalid JSON"),
        Case("empty", b"", R.INVALID_JSON, "invalid JSON"),
        Case("NaN literal", b'{"v": 1, "kind": "gpu", "temp_c": NaN}', R.INVALID_JSON, "invalid"),
        Case("array top level", b"[1, 2]", R.NOT_AN_OBJECT, "got array"),
        Case("string top level", b'"x"', R.NOT_AN_OBJECT, "got string"),
        Case("missing v", _drop(c, "v"), M, "v: required field missing"),
        Case("version 2", _set(c, "v", 2), R.BAD_VERSION, "v: unsupported version 2"),
        Case("version as string", _set(c, "v", "1"), R.BAD_VERSION, "unsupported version '1'"),
        Case("version true", _set(c, "v", True), R.BAD_VERSION, "unsupported version True"),
        Case("missing kind", _drop(c, "kind"), M, "kind: required field missing"),
        Case("unknown kind", _set(c, "kind", "metric"), R.UNKNOWN_KIND, "unknown kind 'metric'"),
        Case("kind not a string", _set(c, "kind", 7), R.UNKNOWN_KIND, "unknown kind 7"),
        Case("missing job", _drop(c, "job"), M, "job: required field missing"),
        Case("empty job id", _set(c, "job", ""), V, "job: should have at least 1 character"),
        Case("job as number", _set(c, "job", 42), T, "job: should be a valid string"),
        Case("comm_size zero", _set(c, "comm_size", 0), V, "comm_size: should be greater"),
        Case("negative rank", _set(c, "rank", -1), V, "rank: should be greater than or equal"),
        Case("rank >= comm_size", _set(c, "rank", 20), X, "rank: 20 >= comm_size 16", True),
        Case("rank as float", _set(c, "rank", 3.0), T, "rank: should be a valid integer", True),
        Case("rank as bool", _set(c, "rank", True), T, "rank: should be a valid integer"),
        Case("rank as string", _set(c, "rank", "3"), T, "got string '3'"),
        Case("negative ts_ns", _set(c, "ts_ns", -5), V, "ts_ns: should be greater"),
        Case("gpu negative", _set(c, "gpu", -1), V, "gpu: should be greater"),
        Case("missing ops", _drop(c, "ops"), M, "ops: required field missing"),
        Case("ops not object", _set(c, "ops", [1]), T, "ops: should be a valid dictionary"),
        Case("missing ops.seq", _drop(c, "ops.seq"), M, "ops.seq: required field missing"),
        Case("unknown op", _set(c, "ops.op.1", "allmagic"), V, "ops.op[1]: should be 'allreduce'"),
        Case("negative bytes", _set(c, "ops.bytes.0", -1), V, "ops.bytes[0]: should be greater"),
        Case("bytes as float", _set(c, "ops.bytes.0", 1.5), T, "ops.bytes[0]: should be a valid"),
        Case(
            "end before enter",
            _set(c, "ops.end_ns.0", 1733129999000000000),
            X,
            "ops.end_ns[0]: 1733129999000000000 < enter_ns 1733129999100000000",
            True,
        ),
        Case(
            "ops unequal", _set(c, "ops.seq", [1001]), X, "ops.op: 2 elements but seq has 1", True
        ),
        Case(
            "ops end_ns short",
            _set(c, "ops.end_ns", [None]),
            X,
            "ops.end_ns: 1 elements but seq has 2",
            True,
        ),
        Case("seq negative", _set(c, "ops.seq.0", -3), V, "ops.seq[0]: should be greater"),
        Case("seq null", _set(c, "ops.seq.0", None), T, "ops.seq[0]: should be a valid integer"),
        Case(
            "conns unequal",
            _set(c, "conns.busy_ns", [1]),
            X,
            "conns.busy_ns: 1 elements but peer has 2",
            True,
        ),
        Case(
            "conn peer out of comm",
            _set(c, "conns.peer.0", 16),
            X,
            "conns.peer[0]: 16 >= comm_size 16",
            True,
        ),
        Case(
            "conn peer is self",
            _set(c, "conns.peer.0", 3),
            X,
            "conns.peer[0]: 3 is the rank itself",
            True,
        ),
        Case("conn negative bytes", _set(c, "conns.bytes.1", -2), V, "conns.bytes[1]: should be"),
        Case(
            "send in a big comm",
            _set(c, "ops.op.0", "send"),
            X,
            "ops.op[0]: send needs a two-member communicator",
            True,
        ),
        Case("link bad state", _set("link", "state", "flapping"), V, "state: should be 'up'"),
        Case(
            "link negative counter",
            _set("link", "counters.symbol_err", -1),
            V,
            "counters.symbol_err: should be greater",
        ),
        Case(
            "link counter float",
            _set("link", "counters.tx_bytes", 1.5),
            T,
            "counters.tx_bytes: should be a valid integer",
        ),
        Case("link negative gbps", _set("link", "gbps", -200), V, "gbps: should be greater"),
        Case("link missing counters", _drop("link", "counters"), M, "counters: required"),
        Case("gpu xid not list", _set("gpu", "xid", 79), T, "xid: should be a valid tuple"),
        Case("gpu negative xid", _set("gpu", "xid", [-79]), V, "xid[0]: should be greater"),
        Case("gpu negative power", _set("gpu", "power_w", -1.0), V, "power_w: should be greater"),
        Case("job bad state", _set("job", "state", "paused"), V, "state: should be 'running'"),
        Case(
            "job rank twice",
            _set(
                "job", "ranks", [{"rank": 0, "node": "node-000"}, {"rank": 0, "node": "node-001"}]
            ),
            X,
            "ranks[1].rank: rank 0 listed twice",
            True,
        ),
        Case(
            "job member twice",
            _set("job", "comms", {"7f3a9c": [0, 0]}),
            X,
            "comms.7f3a9c[1]: rank 0 listed twice",
            True,
        ),
        Case(
            "job rank missing node",
            _drop("job", "ranks.0.node"),
            M,
            "ranks[0].node: required field missing",
        ),
        Case(
            "diagnosis bad class",
            _set("diagnosis", "class", "slow"),
            V,
            "class: should be 'comm_hang'",
        ),
        Case(
            "diagnosis score > 1",
            _set("diagnosis", "suspects.0.score", 1.5),
            V,
            "suspects[0].score: should be less than or equal to 1",
        ),
        Case(
            "diagnosis bad suspect type",
            _set("diagnosis", "suspects.0.type", "rack"),
            V,
            "suspects[0].type: should be 'rank'",
        ),
        Case(
            "diagnosis concluded before onset",
            _set("diagnosis", "ts_ns", 1),
            X,
            "ts_ns: 1 < onset_ns",
            True,
        ),
        Case("diagnosis missing job", _drop("diagnosis", "job"), M, "job: required field missing"),
        Case("diagnosis bad state", _set("diagnosis", "state", "open"), V, "state: should be"),
        Case("action bad status", _set("action", "status", "ok"), V, "status: should be 'done'"),
        Case(
            "action failed without reason",
            _set("action", "status", "failed"),
            X,
            "detail.reason: required when status is failed",
            True,
        ),
        Case("action unknown action", _set("action", "action", "reboot"), V, "action: should be"),
        Case(
            "route sport too big",
            _set("route", "paths.0.sport", 70000),
            V,
            "paths[0].sport: should be less than or equal to 65535",
        ),
        Case("route missing via", _drop("route", "paths.0.via"), M, "paths[0].via: required"),
        Case(
            "deadletter payload not string",
            _set("deadletter", "payload", {"a": 1}),
            T,
            "payload: should be a valid string",
        ),
        Case(
            "topology spine as port leaf",
            _set("topology", "nodes.0.ports.0.leaf", "spine-0"),
            X,
            "nodes[0].ports[0].leaf: 'spine-0' is a spine, not a leaf",
            True,
        ),
        Case(
            "topology bad tier",
            _set("topology", "switches.0.tier", 3),
            V,
            "switches[0].tier: should be 1 or 2",
        ),
        Case(
            "topology link to unknown switch",
            _set("topology", "links.0.b", "spine-9"),
            X,
            "links[0].b: unknown switch 'spine-9'",
            True,
        ),
        Case(
            "topology zero gbps",
            _set("topology", "links.0.gbps", 0),
            V,
            "links[0].gbps: should be greater than 0",
        ),
        Case(
            "flows src not a port id",
            _set("flows", "flows.0.src", "node-000"),
            V,
            "flows[0].src: should match pattern",
        ),
        Case(
            "flows src == dst",
            _set("flows", "flows.0.dst", "node-000/mlx5_0:1"),
            X,
            "flows[0].dst: same port as src",
            True,
        ),
        Case("plan negative util", _set("plan", "max_util", -0.1), V, "max_util: should be"),
        Case(
            "plan empty path",
            _set("plan", "paths.0.links", []),
            V,
            "paths[0].links: should have at least 1 item",
        ),
    ]


def case_ids() -> list[str]:
    """Test ids, one per case."""
    return [case.name for case in invalid_cases()]

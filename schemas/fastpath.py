"""The hot kinds (collective, link) decoded by msgspec, without a pydantic validation each.

`schemas.codec.decode` tries `decode_hot` first. msgspec parses the bytes and checks the
fields' types and bounds in compiled code (frozen Structs of the same fields); the contract's
cross-field rules (`x-c4-rules`) are checked here; the pydantic model is then assembled as
`BaseModel.model_construct` assembles one, without validating again. Any document that fails
here, of a hot kind or not, goes the models' way, which accepts it after all or says exactly
why not (code, field path and text): so this path only has to be strict. One that lets an
invalid document through is a bug; one that sends a valid document the slow way costs time
only. tests/unit/test_fastpath.py holds both to the same answers, valid input and broken.
bench/bench_decode.py measures them side by side (1.5-1.7x pydantic here; checks
written in Python on orjson's result were slower than pydantic's compiled ones).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from pydantic import BaseModel

from schemas.base import MAX_ID_CHARS, MAX_ITEMS, C4Model
from schemas.messages import (
    MAX_BATCH_MESSAGES,
    P2P_OPS,
    Collective,
    Conns,
    Link,
    LinkCounters,
    OpName,
    Ops,
)

# orjson reads an integer beyond 64 bits as a float, which the models reject: so must this
# path (msgspec bounds fit in int64: a larger integer, valid or not, goes the slow way).
_MAX_INT = 2**63 - 1
Count = Annotated[int, msgspec.Meta(ge=0, le=_MAX_INT)]
Ident = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]
Counts = Annotated[tuple[Count, ...], msgspec.Meta(max_length=MAX_ITEMS)]


class _Ops(msgspec.Struct, frozen=True):
    seq: Counts
    op: Annotated[tuple[OpName, ...], msgspec.Meta(max_length=MAX_ITEMS)]
    bytes: Counts
    enter_ns: Counts
    end_ns: Annotated[tuple[Count | None, ...], msgspec.Meta(max_length=MAX_ITEMS)]


class _Conns(msgspec.Struct, frozen=True):
    peer: Counts
    port: Annotated[tuple[Ident, ...], msgspec.Meta(max_length=MAX_ITEMS)]
    bytes: Counts
    busy_ns: Counts


class _Collective(msgspec.Struct, frozen=True, tag_field="kind", tag="collective"):
    v: Literal[1]
    job: Ident
    comm: Ident
    comm_size: Annotated[int, msgspec.Meta(ge=1, le=_MAX_INT)]
    rank: Count
    global_rank: Count
    ts_ns: Count
    ops: _Ops
    node: Ident | None = None
    gpu: Count | None = None
    conns: _Conns | None = None


class _Counters(msgspec.Struct, frozen=True):
    tx_bytes: Count | None = None
    rx_bytes: Count | None = None
    tx_pkts: Count | None = None
    rx_pkts: Count | None = None
    tx_wait: Count | None = None
    symbol_err: Count | None = None
    link_down: Count | None = None
    rx_err: Count | None = None
    out_of_seq: Count | None = None
    cnp_sent: Count | None = None
    cnp_handled: Count | None = None
    timeout_retrans: Count | None = None


class _Link(msgspec.Struct, frozen=True, tag_field="kind", tag="link"):
    v: Literal[1]
    node: Ident
    port: Ident
    ts_ns: Count
    state: Literal["up", "down"]
    counters: _Counters
    gbps: Annotated[float, msgspec.Meta(ge=0)] | None = None


class _Collectives(msgspec.Struct, frozen=True, tag_field="kind", tag="collectives"):
    v: Literal[1]
    job: Ident
    ts_ns: Count
    # A union, so that each element's own "kind" is required (a lone tagged Struct is
    # decoded without its tag); a link in a batch goes the slow way, which rejects it.
    messages: Annotated[
        tuple[_Collective | _Link, ...], msgspec.Meta(max_length=MAX_BATCH_MESSAGES)
    ]
    node: Ident | None = None


_DECODER = msgspec.json.Decoder(_Collective | _Link | _Collectives)
_HOT_KINDS = frozenset(("collective", "link"))
_BATCH_KINDS = frozenset((None, "collective", "collectives"))
_COUNTER_NAMES = tuple(LinkCounters.model_fields)
_OPS_FIELDS = frozenset(Ops.model_fields)
_CONNS_FIELDS = frozenset(Conns.model_fields)
# The slots every pydantic model has, set as `BaseModel.model_construct` sets them.
_SLOTS = BaseModel.__dict__
_set_fields_set = _SLOTS["__pydantic_fields_set__"].__set__
_set_extra = _SLOTS["__pydantic_extra__"].__set__
_set_private = _SLOTS["__pydantic_private__"].__set__
_set_attribute = object.__setattr__
_new = object.__new__


def _assembled(model: type[C4Model], values: dict[str, Any], given: set[str]) -> Any:
    instance = _new(model)
    _set_attribute(instance, "__dict__", values)
    _set_fields_set(instance, given)
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


def decode_hot(data: bytes | bytearray | memoryview | str, kind: str | None) -> C4Model | None:
    """The model of a certainly valid collective or link document, else None."""
    if kind is not None and kind not in _HOT_KINDS:
        return None
    try:
        wire = _DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if isinstance(wire, _Collectives):
        return None  # a batch as one model goes the slow way; see decode_hot_batch
    return _single(wire, kind)


def decode_hot_batch(
    data: bytes | bytearray | memoryview | str, kind: str | None
) -> list[C4Model] | None:
    """The messages of a certainly valid ``collectives`` batch (or one certainly valid
    collective or link document, as a list of one), else None.

    ``kind`` is what the caller reads: None (any kind), ``collective`` (a collective or a
    batch of them, as on c4.collective.v1) or ``collectives`` (a batch only).
    """
    if kind not in _BATCH_KINDS and kind not in _HOT_KINDS:
        return None
    try:
        wire = _DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if not isinstance(wire, _Collectives):
        if kind == "collectives":
            return None
        single = _single(wire, kind)
        return None if single is None else [single]
    if kind == "link" or not wire.messages:
        return None  # an empty batch is a node's presence: the slow path keeps its envelope
    job = wire.job
    found: list[C4Model] = []
    append = found.append
    for element in wire.messages:
        if not isinstance(element, _Collective) or element.job != job:
            return None
        message = _collective(element)
        if message is None:
            return None
        append(message)
    return found


def _single(wire: _Collective | _Link, kind: str | None) -> C4Model | None:
    if isinstance(wire, _Collective):
        if kind == "link":
            return None
        return _collective(wire)
    if kind == "collective":
        return None
    return _link(wire)


def _collective(wire: _Collective) -> Collective | None:
    size, rank = wire.comm_size, wire.rank
    if rank >= size:
        return None
    ops = wire.ops
    count = len(ops.seq)
    if not (len(ops.op) == len(ops.bytes) == len(ops.enter_ns) == len(ops.end_ns) == count):
        return None
    for enter, end in zip(ops.enter_ns, ops.end_ns, strict=True):
        if end is not None and end < enter:
            return None
    if size != 2 and not P2P_OPS.isdisjoint(ops.op):
        return None
    conns = None
    raw_conns = wire.conns
    if raw_conns is not None:
        peers = raw_conns.peer
        if not (len(raw_conns.port) == len(raw_conns.bytes) == len(raw_conns.busy_ns)):
            return None
        if len(raw_conns.port) != len(peers) or rank in peers:
            return None
        if peers and max(peers) >= size:
            return None
        conns_values = {
            "peer": peers,
            "port": raw_conns.port,
            "bytes": raw_conns.bytes,
            "busy_ns": raw_conns.busy_ns,
        }
        conns = _assembled(Conns, conns_values, set(_CONNS_FIELDS))
    ops_values = {
        "seq": ops.seq,
        "op": ops.op,
        "bytes": ops.bytes,
        "enter_ns": ops.enter_ns,
        "end_ns": ops.end_ns,
    }
    values = {
        "v": 1,
        "kind": "collective",
        "job": wire.job,
        "comm": wire.comm,
        "comm_size": size,
        "rank": rank,
        "global_rank": wire.global_rank,
        "node": wire.node,
        "gpu": wire.gpu,
        "ts_ns": wire.ts_ns,
        "ops": _assembled(Ops, ops_values, set(_OPS_FIELDS)),
        "conns": conns,
    }
    built: Collective = _assembled(Collective, values, _given(values))
    return built


def _link(wire: _Link) -> Link:
    raw = wire.counters
    counters = {name: getattr(raw, name) for name in _COUNTER_NAMES}
    values = {
        "v": 1,
        "kind": "link",
        "node": wire.node,
        "port": wire.port,
        "ts_ns": wire.ts_ns,
        "state": wire.state,
        "gbps": wire.gbps,
        "counters": _assembled(LinkCounters, counters, _given(counters)),
    }
    built: Link = _assembled(Link, values, _given(values))
    return built


def _given(values: dict[str, Any]) -> set[str]:
    """The fields set: those with a value (a field given as null is left out, unlike after
    validation; ``model_fields_set`` is read nowhere in c4)."""
    return {name for name, value in values.items() if value is not None}

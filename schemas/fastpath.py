"""The hot kinds (collective, link) decoded by msgspec, without a pydantic validation each.

`schemas.codec.decode` tries `decode_hot` first. msgspec parses the bytes and checks the
fields' types and bounds in compiled code (frozen Structs of the same fields); the contract's
cross-field rules (`x-c4-rules`) are checked here; the pydantic model is then assembled as
`BaseModel.model_construct` assembles one, without validating again. Any document that fails
here, of a hot kind or not, goes the models' way, which accepts it after all or says exactly
why not (code, field path and text): so this path only has to be strict. One that lets an
invalid document through is a bug; one that sends a valid document the slow way costs time
only. tests/unit/test_fastpath.py holds both to the same answers, valid input and broken.
bench/bench_decode.py measures them side by side (1.75-2x pydantic here; checks
written in Python on orjson's result were slower than pydantic's compiled ones).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import ge, is_not
from typing import Annotated, Any, Literal, TypedDict, cast

import msgspec
from msgspec import UNSET, UnsetType
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

# Optional fields default to UNSET, not None: a field given as null is then told from one
# left out, and is in `model_fields_set` exactly where validation puts it.


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
    node: Ident | None | UnsetType = UNSET
    gpu: Count | None | UnsetType = UNSET
    conns: _Conns | None | UnsetType = UNSET
    restart: Count | None | UnsetType = UNSET


class _Counters(TypedDict, total=False):
    """LinkCounters' fields, decoded to a dict of those given (any subset)."""

    tx_bytes: Count | None
    rx_bytes: Count | None
    tx_pkts: Count | None
    rx_pkts: Count | None
    tx_wait: Count | None
    symbol_err: Count | None
    link_down: Count | None
    rx_err: Count | None
    out_of_seq: Count | None
    cnp_sent: Count | None
    cnp_handled: Count | None
    timeout_retrans: Count | None


class _Link(msgspec.Struct, frozen=True, tag_field="kind", tag="link"):
    v: Literal[1]
    node: Ident
    port: Ident
    ts_ns: Count
    state: Literal["up", "down"]
    counters: _Counters
    gbps: Annotated[float, msgspec.Meta(ge=0)] | None | UnsetType = UNSET


class _Collectives(msgspec.Struct, frozen=True, tag_field="kind", tag="collectives"):
    v: Literal[1]
    job: Ident
    ts_ns: Count
    # A union, so that each element's own "kind" is required (a lone tagged Struct is
    # decoded without its tag); a link in a batch goes the slow way, which rejects it.
    messages: Annotated[
        tuple[_Collective | _Link, ...], msgspec.Meta(max_length=MAX_BATCH_MESSAGES)
    ]
    node: Ident | None | UnsetType = UNSET


class _Links(msgspec.Struct, frozen=True, tag_field="kind", tag="links"):
    v: Literal[1]
    node: Ident
    ts_ns: Count
    # A union, as in _Collectives: each element's own "kind" is required.
    messages: Annotated[
        tuple[_Link | _Collective, ...], msgspec.Meta(max_length=MAX_BATCH_MESSAGES)
    ]


_DECODER = msgspec.json.Decoder(_Collective | _Link | _Collectives | _Links)
_HOT_KINDS = frozenset(("collective", "link"))
# What each reader kind takes as a batch here (the others go the slow way).
_BATCH_READERS: dict[str | None, type[msgspec.Struct] | None] = {
    None: None,  # any batch
    "collective": _Collectives,
    "collectives": _Collectives,
    "link": _Links,
    "links": _Links,
}
_BATCH_ONLY = frozenset(("collectives", "links"))
# Fields set that do not depend on the document: every field of Ops and Conns is required,
# and so are those of Collective and Link but their optional ones.
_OPS_FIELDS = frozenset(Ops.model_fields)
_CONNS_FIELDS = frozenset(Conns.model_fields)
_COLLECTIVE_REQUIRED = frozenset(
    name for name, field in Collective.model_fields.items() if field.is_required()
)
_LINK_REQUIRED = frozenset(name for name, field in Link.model_fields.items() if field.is_required())
# LinkCounters' __dict__ before the given counters are laid over it: every field, in the
# model's order (model_dump and encode follow the order of __dict__).
_NO_COUNTERS: dict[str, object] = dict.fromkeys(LinkCounters.model_fields)
# The slots every pydantic model has, set as `BaseModel.model_construct` sets them.
_SLOTS = BaseModel.__dict__
_set_dict = _SLOTS["__dict__"].__set__
_set_fields_set = _SLOTS["__pydantic_fields_set__"].__set__
_set_extra = _SLOTS["__pydantic_extra__"].__set__
_set_private = _SLOTS["__pydantic_private__"].__set__
_new = object.__new__


def _assembled(model: type[C4Model], values: dict[str, Any], given: set[str]) -> Any:
    instance = _new(model)
    _set_dict(instance, values)
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
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        # Nested past the interpreter's bound: the slow path says why, in one line.
        return None
    if isinstance(wire, _Collectives | _Links):
        return None  # a batch as one model goes the slow way; see decode_hot_batch
    return _single(wire, kind)


def decode_hot_batch(
    data: bytes | bytearray | memoryview | str, kind: str | None
) -> list[C4Model] | None:
    """The messages of a certainly valid ``collectives`` or ``links`` batch (or one
    certainly valid collective or link document, as a list of one), else None.

    ``kind`` is what the caller reads: None (any kind), ``collective`` (a collective or a
    batch of them, as on c4.collective.v1), ``link`` (likewise, on c4.link.v1), or a batch
    kind (a batch only).
    """
    if kind not in _BATCH_READERS:
        return None
    try:
        wire = _DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(wire, _Collectives | _Links):
        if kind in _BATCH_ONLY:
            return None
        single = _single(wire, kind)
        return None if single is None else [single]
    wanted = _BATCH_READERS[kind]
    if (wanted is not None and not isinstance(wire, wanted)) or not wire.messages:
        # Another topic's batch, or an empty one (of collectives: a node's presence, whose
        # envelope the slow path keeps).
        return None
    if isinstance(wire, _Links):
        return _links(wire)
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


def _links(wire: _Links) -> list[C4Model] | None:
    node = wire.node
    found: list[C4Model] = []
    for element in wire.messages:
        if not isinstance(element, _Link) or element.node != node:
            return None
        found.append(_link(element))
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
    # The x-c4-rules of Ops, Conns and Collective, each over a whole tuple in C where a
    # builtin can (len, all/map, isdisjoint, in, max) rather than a Python loop per element.
    size, rank = wire.comm_size, wire.rank
    if rank >= size:
        return None
    ops = wire.ops
    names, enters, ends = ops.op, ops.enter_ns, ops.end_ns
    count = len(enters)
    if not (len(ops.seq) == len(names) == len(ops.bytes) == len(ends) == count):
        return None
    if not _ends_in_order(enters, ends):
        return None
    if size != 2 and not P2P_OPS.isdisjoint(names):
        return None
    given = set(_COLLECTIVE_REQUIRED)
    node, gpu, raw_conns = wire.node, wire.gpu, wire.conns
    if node is UNSET:
        node = None
    else:
        given.add("node")
    if gpu is UNSET:
        gpu = None
    else:
        given.add("gpu")
    restart = wire.restart
    if restart is UNSET:
        restart = None
    else:
        given.add("restart")
    conns = None
    if raw_conns is not UNSET:
        given.add("conns")
        if raw_conns is not None:
            conns = _conns(raw_conns, rank, size)
            if conns is None:
                return None
    ops_values = {
        "seq": ops.seq,
        "op": names,
        "bytes": ops.bytes,
        "enter_ns": enters,
        "end_ns": ends,
    }
    values = {
        "v": 1,
        "kind": "collective",
        "job": wire.job,
        "comm": wire.comm,
        "comm_size": size,
        "rank": rank,
        "global_rank": wire.global_rank,
        "node": node,
        "gpu": gpu,
        "ts_ns": wire.ts_ns,
        "ops": _assembled(Ops, ops_values, set(_OPS_FIELDS)),
        "conns": conns,
        "restart": restart,
    }
    built: Collective = _assembled(Collective, values, given)
    return built


def _ends_in_order(enters: tuple[int, ...], ends: tuple[int | None, ...]) -> bool:
    """Whether no op ends before it entered (a null end: the op is still running)."""
    if None not in ends:  # the common case: one loop in C
        return all(map(ge, cast("tuple[int, ...]", ends), enters))
    # Ops still running (more of them the larger the group): the ended ones, still in C
    # (catching the TypeError a null end raises, then looping in Python, cost twice this).
    ended = list(map(is_not, ends, repeat(None)))
    return all(map(ge, compress(ends, ended), compress(enters, ended)))  # type: ignore[arg-type]


def _conns(wire: _Conns, rank: int, size: int) -> Conns | None:
    peers, ports = wire.peer, wire.port
    if not (len(ports) == len(wire.bytes) == len(wire.busy_ns) == len(peers)):
        return None
    if rank in peers or (peers and max(peers) >= size):
        return None
    values = {"peer": peers, "port": ports, "bytes": wire.bytes, "busy_ns": wire.busy_ns}
    built: Conns = _assembled(Conns, values, set(_CONNS_FIELDS))
    return built


def _link(wire: _Link) -> Link:
    given_counters = wire.counters
    counters = _NO_COUNTERS.copy()
    counters.update(given_counters)  # keeps the model's order: every key is there already
    given = set(_LINK_REQUIRED)
    gbps = wire.gbps
    if gbps is UNSET:
        gbps = None
    else:
        given.add("gbps")
    values = {
        "v": 1,
        "kind": "link",
        "node": wire.node,
        "port": wire.port,
        "ts_ns": wire.ts_ns,
        "state": wire.state,
        "gbps": gbps,
        "counters": _assembled(LinkCounters, counters, set(given_counters)),
    }
    built: Link = _assembled(Link, values, given)
    return built

"""Pack a node's messages of one interval into batches: ``collectives`` (one record per job,
node and interval), ``links`` and ``gpus`` (one record per node and interval).

A rank reports each of its communicators once per interval, so a node of 8 GPUs in a 3D
job sends tens of small messages a second per job; its agent adds one link message per port
and one GPU message per GPU. Sent alone, each costs a Kafka record and the consumer's
per-record work; packed, one record carries them all (contract v1, additions). Batches are
cut at `MAX_BATCH_MESSAGES` messages and about `MAX_BATCH_BYTES` of JSON, so a record stays
well under Kafka's default 1 MiB limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from schemas.base import C4Model
from schemas.messages import (
    MAX_BATCH_MESSAGES,
    Collective,
    Collectives,
    Gpu,
    Gpus,
    Link,
    LinkCounters,
    Links,
)

MAX_BATCH_BYTES = 512 * 1024
# What a message costs in JSON, roughly: a collective's envelope, each operation, each
# connection; a link's envelope and each counter it has; a GPU's envelope, each XID, each
# throttle reason (ids are counted as they are). A link's is an upper bound: its envelope
# is under 130 bytes besides its ids, a counter of 20 digits under 40.
_MESSAGE_BYTES, _OP_BYTES, _CONN_BYTES = 320, 90, 70
_LINK_BYTES, _COUNTER_BYTES = 130, 40
_GPU_BYTES, _XID_BYTES, _THROTTLE_BYTES = 200, 12, 3
_COUNTERS = tuple(LinkCounters.model_fields)

_M = TypeVar("_M", Collective, Link, Gpu)


def _estimate(message: Collective) -> int:
    conns = 0 if message.conns is None else len(message.conns.peer)
    return _MESSAGE_BYTES + _OP_BYTES * len(message.ops.seq) + _CONN_BYTES * conns


def _link_estimate(message: Link) -> int:
    counters = message.counters
    present = sum(getattr(counters, name, None) is not None for name in _COUNTERS)
    return _LINK_BYTES + len(message.node) + len(message.port) + _COUNTER_BYTES * present


def _gpu_estimate(message: Gpu) -> int:
    throttle = sum(len(reason) + _THROTTLE_BYTES for reason in message.throttle or ())
    return _GPU_BYTES + len(message.node) + _XID_BYTES * len(message.xid) + throttle


def _chunks(messages: Sequence[_M], estimate: Callable[[_M], int]) -> list[list[_M]]:
    """The messages in order, cut within the count and size bounds."""
    found: list[list[_M]] = []
    chunk: list[_M] = []
    size = 0
    for message in messages:
        cost = estimate(message)
        if chunk and (len(chunk) >= MAX_BATCH_MESSAGES or size + cost > MAX_BATCH_BYTES):
            found.append(chunk)
            chunk, size = [], 0
        chunk.append(message)
        size += cost
    if chunk:
        found.append(chunk)
    return found


def batches_of(job: str, node: str | None, messages: Sequence[Collective]) -> list[Collectives]:
    """One job's messages as batches, in order, each within the count and size bounds."""
    return [
        Collectives(
            v=1,
            kind="collectives",
            job=job,
            node=node,
            ts_ns=max(message.ts_ns for message in chunk),
            messages=tuple(chunk),
        )
        for chunk in _chunks(messages, _estimate)
    ]


def link_batches_of(node: str, messages: Sequence[Link]) -> list[Links]:
    """One node's link messages as batches, in order, each within the bounds."""
    return [
        Links(
            v=1,
            kind="links",
            node=node,
            ts_ns=max(message.ts_ns for message in chunk),
            messages=tuple(chunk),
        )
        for chunk in _chunks(messages, _link_estimate)
    ]


def gpu_batches_of(node: str, messages: Sequence[Gpu]) -> list[Gpus]:
    """One node's GPU messages as batches, in order, each within the bounds."""
    return [
        Gpus(
            v=1,
            kind="gpus",
            node=node,
            ts_ns=max(message.ts_ns for message in chunk),
            messages=tuple(chunk),
        )
        for chunk in _chunks(messages, _gpu_estimate)
    ]


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where one group's batches go: the group's kind, whose messages (job or node) and,
    for a job's, the node its batches name."""

    kind: Literal["collective", "link", "gpu"]
    owner: str
    node: str | None = None


@dataclass(slots=True)
class _Gathered:
    """Messages in their order, each group's batchable ones gathered at the place of the
    group's first: a job's collective messages (from one node), a node's link messages, a
    node's GPU messages. Within a group the messages keep their order.

    ``node`` names the node in every collectives batch (an agent's round: its node, or
    none); with ``each_node`` (a stream of many nodes) a job's collective messages are
    grouped by the node each names instead, and their batches name that one.
    """

    node: str | None = None
    each_node: bool = False
    places: list[C4Model | _Slot] = field(default_factory=list)
    jobs: dict[_Slot, list[Collective]] = field(default_factory=dict)
    links: dict[_Slot, list[Link]] = field(default_factory=dict)
    gpus: dict[_Slot, list[Gpu]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.places)

    def add(self, message: C4Model) -> None:
        if isinstance(message, Collective):
            node = message.node if self.each_node else self.node
            self._join(self.jobs, _Slot("collective", message.job, node), message)
        elif isinstance(message, Link):
            self._join(self.links, _Slot("link", message.node), message)
        elif isinstance(message, Gpu):
            self._join(self.gpus, _Slot("gpu", message.node), message)
        else:
            self.places.append(message)

    def _join(self, groups: dict[_Slot, list[_M]], slot: _Slot, message: _M) -> None:
        group = groups.get(slot)
        if group is None:
            group = groups[slot] = []
            self.places.append(slot)
        group.append(message)

    def packed(self) -> list[C4Model]:
        """Everything gathered, in order, each group as its batches; and forget it."""
        out: list[C4Model] = []
        for item in self.places:
            if not isinstance(item, _Slot):
                out.append(item)
            elif item.kind == "collective":
                out.extend(batches_of(item.owner, item.node, self.jobs[item]))
            elif item.kind == "link":
                out.extend(link_batches_of(item.owner, self.links[item]))
            else:
                out.extend(gpu_batches_of(item.owner, self.gpus[item]))
        self.places.clear()
        self.jobs.clear()
        self.links.clear()
        self.gpus.clear()
        return out


def pack_round(messages: Iterable[C4Model], node: str | None = None) -> list[C4Model]:
    """One agent round: its collective messages packed per job, its link and GPU messages
    per node (each batch names its messages' node), everything else as it was.

    The batches come where each group's first message was; a group's messages keep their
    order. ``node`` names the node in the collectives batches.
    """
    gathered = _Gathered(node)
    for message in messages:
        gathered.add(message)
    return gathered.packed()


def pack_stream(messages: Iterable[C4Model]) -> Iterator[C4Model]:
    """A time-ordered stream with each interval's collective messages packed per job and
    node, and its link and GPU messages per node.

    Consecutive batchable messages of the same report time (one interval of a simulated or
    recorded cluster) are held and sent as batches when the time moves on, before any later
    message. Each batch takes the place of its group's first message of the interval, and
    what came after that waits behind it, so a reader meets the elements in the order the
    unbatched stream had them (but for the groups' interleaving). Other messages pass at
    once while nothing is held. A collective message without a node is packed with the
    others of its job that lack one.
    """
    held = _Gathered(each_node=True)
    held_ts = -1
    for message in messages:
        ts_ns = getattr(message, "ts_ns", None)
        if held and isinstance(ts_ns, int) and ts_ns > held_ts:
            # Nothing later passes the held batches: event time moves on in order.
            yield from held.packed()
        if isinstance(message, Collective | Link | Gpu):
            if held and message.ts_ns != held_ts:
                yield from held.packed()
            held_ts = message.ts_ns
            held.add(message)
        elif held:
            held.add(message)  # keeps its place behind the batches before it
        else:
            yield message
    yield from held.packed()

"""Pack collective messages into ``collectives`` batches: one record per job, node, interval.

A rank reports each of its communicators once per interval, so a node of 8 GPUs in a 3D
job sends tens of small messages a second per job. Sent alone, each costs a Kafka record
and the consumer's per-record work; packed, one record carries them all (contract v1,
additions). Batches are cut at `MAX_BATCH_MESSAGES` messages and about `MAX_BATCH_BYTES`
of JSON, so a record stays well under Kafka's default 1 MiB limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from schemas.base import C4Model
from schemas.messages import MAX_BATCH_MESSAGES, Collective, Collectives

MAX_BATCH_BYTES = 512 * 1024
# What a message costs in JSON, roughly: its envelope, each operation, each connection.
_MESSAGE_BYTES, _OP_BYTES, _CONN_BYTES = 320, 90, 70


def _estimate(message: Collective) -> int:
    conns = 0 if message.conns is None else len(message.conns.peer)
    return _MESSAGE_BYTES + _OP_BYTES * len(message.ops.seq) + _CONN_BYTES * conns


def batches_of(job: str, node: str | None, messages: Sequence[Collective]) -> list[Collectives]:
    """One job's messages as batches, in order, each within the count and size bounds."""
    found: list[Collectives] = []
    chunk: list[Collective] = []
    size = 0
    for message in messages:
        cost = _estimate(message)
        if chunk and (len(chunk) >= MAX_BATCH_MESSAGES or size + cost > MAX_BATCH_BYTES):
            found.append(_batch(job, node, chunk))
            chunk, size = [], 0
        chunk.append(message)
        size += cost
    if chunk:
        found.append(_batch(job, node, chunk))
    return found


def _batch(job: str, node: str | None, messages: list[Collective]) -> Collectives:
    return Collectives(
        v=1,
        kind="collectives",
        job=job,
        node=node,
        ts_ns=max(message.ts_ns for message in messages),
        messages=tuple(messages),
    )


def pack_round(messages: Iterable[C4Model], node: str | None = None) -> list[C4Model]:
    """One agent round: its collective messages packed per job, everything else as it was.

    The batches come where each job's first message was; a job's messages keep their order.
    """
    out: list[C4Model | str] = []
    by_job: dict[str, list[Collective]] = {}
    for message in messages:
        if isinstance(message, Collective):
            group = by_job.get(message.job)
            if group is None:
                group = by_job[message.job] = []
                out.append(message.job)  # the place of this job's batches
            group.append(message)
        else:
            out.append(message)
    packed: list[C4Model] = []
    for item in out:
        if isinstance(item, str):
            packed.extend(batches_of(item, node, by_job[item]))
        else:
            packed.append(item)
    return packed


def pack_stream(messages: Iterable[C4Model]) -> Iterator[C4Model]:
    """A time-ordered stream with each interval's collective messages packed per job and node.

    Consecutive collective messages of the same report time (one interval of a simulated
    or recorded cluster) are held and sent as one batch per job and node when the time
    moves on, before any later message; every other message passes at once. A message
    without a node is packed with the others of its job that lack one.
    """
    held: dict[tuple[str, str | None], list[Collective]] = {}
    held_ts = -1
    for message in messages:
        ts_ns = getattr(message, "ts_ns", None)
        if held and isinstance(ts_ns, int) and ts_ns > held_ts:
            # Nothing later passes the held batches: event time moves on in order.
            yield from _release(held)
        if isinstance(message, Collective):
            if held and message.ts_ns != held_ts:
                yield from _release(held)
            held_ts = message.ts_ns
            held.setdefault((message.job, message.node), []).append(message)
        else:
            yield message
    yield from _release(held)


def _release(held: dict[tuple[str, str | None], list[Collective]]) -> Iterator[C4Model]:
    for (job, node), group in held.items():
        yield from batches_of(job, node, group)
    held.clear()

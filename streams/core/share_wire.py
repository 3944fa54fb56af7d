"""What the stages on Kafka write to each other: marks into the node stages' partitions,
shares back to the job stage (`streams.core.barriers`).

Both are internal records of one detection app, never read by other consumers: a mark
compact JSON (orjson), a share MessagePack (its rows are mostly numbers; the first format,
compressed JSON, is still read). They are still checked as
they are read: a record that is not one of these is a `WireError`, a dead letter, never a
stopped stage.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from streams import StreamsError
from streams.core.rows import ConnRow, OpsRow, SeenRow
from streams.core.shard import SeqPart
from streams.core.split import JobShare, part_row

WIRE_VERSION = 1
MARK_HEADER = "c4-mark"  # set on every mark; a forwarded report never has it
BARRIER = "barrier"  # hand on what was taken of the job
RUN = "run"  # the job runs as this restart count now: earlier runs' reports are dropped
FORGET = "forget"  # the job stopped: what its groups were in is of no run any more
MARK_KINDS = (BARRIER, RUN, FORGET)


class WireError(StreamsError):
    """An internal record of the stages on Kafka could not be read."""


@dataclass(frozen=True, slots=True)
class Mark:
    """A mark into a node stage's partition: ``kind`` of ``MARK_KINDS``, for ``job``;
    ``number`` is the barrier (`BARRIER`) or the restart count (`RUN`). A barrier names
    the node-stage partitions it was marked into (``sources``: those the job's reports
    went to; None: every partition), so the job stage's gate knows whose shares to wait
    for."""

    kind: str
    job: str
    number: int = 0
    sources: tuple[int, ...] | None = None


# (comm, size, seq, op, nbytes, first_seen_ns, entered_ns, members, enters, ends, inferred):
# a `SeqPart` as `part_row` writes it.
PartRow = tuple[
    str, int, int, str, int, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...], bool
]


class _ShareDocument(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A `JobShare` on the wire (`_share_document`), without its job."""

    run: int | None
    times: tuple[int, ...]
    seen: tuple[SeenRow, ...]
    conns: tuple[ConnRow, ...]
    parts: tuple[PartRow, ...]
    opens: tuple[PartRow, ...]
    finished: tuple[tuple[str, int], ...]
    agents: tuple[tuple[str, int], ...]
    spans: tuple[OpsRow, ...]
    met: tuple[tuple[int, str, int], ...]


class _RecordDocument(msgspec.Struct, frozen=True):
    """A share record on the wire (`encode_share`)."""

    v: int
    job: str
    source: int
    barrier: int
    latest_ns: int
    share: _ShareDocument | None
    sources: tuple[int, ...] | None = None  # absent in records of the first version


_RECORD_DECODER = msgspec.msgpack.Decoder(_RecordDocument)
_RECORD_ENCODER = msgspec.msgpack.Encoder()
# Records of the first wire format (compressed JSON; zlib's header starts 0x78), still read:
# a worker upgraded while the one before it still hands on shares.
_JSON_RECORD_DECODER = msgspec.json.Decoder(_RecordDocument)
_ZLIB_HEADER = 0x78


@dataclass(frozen=True, slots=True)
class ShareRecord:
    """One node stage's share of one barrier of one job (``share`` None: it took nothing of
    it since its last), with the latest event time it took."""

    job: str
    source: int
    barrier: int
    latest_ns: int
    share: JobShare | None
    sources: tuple[int, ...] | None = None  # the partitions its mark went to (None: all)


def encode_mark(mark: Mark) -> bytes:
    """A mark's bytes."""
    document: dict[str, Any] = {"v": WIRE_VERSION, "mark": mark.kind, "job": mark.job}
    document["n"] = mark.number
    if mark.sources is not None:
        document["s"] = mark.sources
    return orjson.dumps(document)


def decode_mark(raw: bytes) -> Mark:
    """The mark ``raw`` holds; `WireError` when it is not one."""
    try:
        document = orjson.loads(raw)
        kind, job, number = document["mark"], document["job"], document["n"]
        sources = document.get("s")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        message = f"not a stage mark: {error}"
        raise WireError(message) from error
    valid = (
        document.get("v") == WIRE_VERSION
        and kind in MARK_KINDS
        and isinstance(job, str)
        and type(number) is int
        and (sources is None or _partition_list(sources))
    )
    if not valid:
        message = f"not a stage mark of version {WIRE_VERSION}: {raw[:120]!r}"
        raise WireError(message)
    return Mark(kind, job, number, None if sources is None else tuple(sources))


def _partition_list(value: Any) -> bool:
    """Whether a mark's sources are a list of partition numbers."""
    return isinstance(value, list) and all(type(p) is int and p >= 0 for p in value)


def encode_share(record: ShareRecord) -> bytes:
    """A share record's bytes: MessagePack, uncompressed. A share carries every report's
    operations of its partition and barrier; compressed JSON cost the two stages about a
    tenth of a split worker following one large job (3.3 ms a share of 124 reports,
    against 1.0 ms), for a record about twice as small."""
    share = record.share
    document: dict[str, Any] = {
        "v": WIRE_VERSION,
        "job": record.job,
        "source": record.source,
        "barrier": record.barrier,
        "latest_ns": record.latest_ns,
        "share": None if share is None else _share_document(share),
    }
    if record.sources is not None:
        document["sources"] = record.sources
    return _RECORD_ENCODER.encode(document)


def decode_share(raw: bytes) -> ShareRecord:
    """The share record ``raw`` holds; `WireError` when it is not one.

    Decoded straight into the rows' tuples by a typed decoder, which also checks every
    field's type: the job stage reads every operation of the job here, and converting
    JSON's lists back to tuples in Python cost about as much as the job stage's own work
    on them."""
    try:
        if raw[:1] == bytes((_ZLIB_HEADER,)):
            document = _JSON_RECORD_DECODER.decode(zlib.decompress(raw))
        else:
            document = _RECORD_DECODER.decode(raw)
    except (zlib.error, msgspec.DecodeError) as error:
        message = f"not a share record: {type(error).__name__}: {error}"
        raise WireError(message) from error
    if document.v != WIRE_VERSION:
        message = f"a share record of version {document.v!r}, not {WIRE_VERSION}"
        raise WireError(message)
    share = document.share
    return ShareRecord(
        document.job,
        document.source,
        document.barrier,
        document.latest_ns,
        None if share is None else _share_of(document.job, share),
        document.sources,
    )


def _share_document(share: JobShare) -> dict[str, Any]:
    return {
        "run": share.run,
        "times": share.times,
        "seen": share.seen,
        "conns": share.conns,
        "parts": [part_row(part) for part in share.parts],
        "opens": [part_row(part) for part in share.opens],
        "finished": share.finished,
        "agents": share.agents,
        "spans": share.spans,
        "met": share.met,
    }


def _share_of(job: str, document: _ShareDocument) -> JobShare:
    """A share from its decoded document: the rows are tuples already, parts become parts."""
    return JobShare(
        job,
        document.run,
        document.times,
        document.seen,
        document.conns,
        tuple(SeqPart(*row) for row in document.parts),
        tuple(SeqPart(*row) for row in document.opens),
        document.finished,
        document.agents,
        document.spans,
        document.met,
    )

"""What the stages on Kafka write to each other: marks into the node stages' partitions,
shares back to the job stage (`streams.core.barriers`).

Both are internal records of one detection app, never read by other consumers: compact
JSON (orjson), a share compressed (its rows are mostly numbers). They are still checked as
they are read: a record that is not one of these is a `WireError`, a dead letter, never a
stopped stage.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import orjson

from streams import StreamsError
from streams.core.split import JobShare, part_of_row, part_row

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
    ``number`` is the barrier (`BARRIER`) or the restart count (`RUN`)."""

    kind: str
    job: str
    number: int = 0


@dataclass(frozen=True, slots=True)
class ShareRecord:
    """One node stage's share of one barrier of one job (``share`` None: it took nothing of
    it since its last), with the latest event time it took."""

    job: str
    source: int
    barrier: int
    latest_ns: int
    share: JobShare | None


def encode_mark(mark: Mark) -> bytes:
    """A mark's bytes."""
    return orjson.dumps({"v": WIRE_VERSION, "mark": mark.kind, "job": mark.job, "n": mark.number})


def decode_mark(raw: bytes) -> Mark:
    """The mark ``raw`` holds; `WireError` when it is not one."""
    try:
        document = orjson.loads(raw)
        kind, job, number = document["mark"], document["job"], document["n"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as error:
        message = f"not a stage mark: {error}"
        raise WireError(message) from error
    valid = (
        document.get("v") == WIRE_VERSION
        and kind in MARK_KINDS
        and isinstance(job, str)
        and type(number) is int
    )
    if not valid:
        message = f"not a stage mark of version {WIRE_VERSION}: {raw[:120]!r}"
        raise WireError(message)
    return Mark(kind, job, number)


def encode_share(record: ShareRecord) -> bytes:
    """A share record's bytes (compressed JSON)."""
    share = record.share
    document = {
        "v": WIRE_VERSION,
        "job": record.job,
        "source": record.source,
        "barrier": record.barrier,
        "latest_ns": record.latest_ns,
        "share": None if share is None else _share_document(share),
    }
    return zlib.compress(orjson.dumps(document), 1)


def decode_share(raw: bytes) -> ShareRecord:
    """The share record ``raw`` holds; `WireError` when it is not one."""
    try:
        document = orjson.loads(zlib.decompress(raw))
        if document["v"] != WIRE_VERSION:
            message = f"a share record of version {document['v']!r}, not {WIRE_VERSION}"
            raise WireError(message)
        job, share = document["job"], document["share"]
        numbers = (document["source"], document["barrier"], document["latest_ns"])
        if not isinstance(job, str) or any(type(n) is not int for n in numbers):
            message = "a share record's job or numbers are not of their types"
            raise WireError(message)
        source, barrier, latest_ns = numbers
        return ShareRecord(
            job, source, barrier, latest_ns, None if share is None else _share_of(job, share)
        )
    except WireError:
        raise
    except (zlib.error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        message = f"not a share record: {type(error).__name__}: {error}"
        raise WireError(message) from error


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


def _share_of(job: str, document: dict[str, Any]) -> JobShare:
    """A share from its JSON: every row a tuple again (they are sorted and compared with
    the rows of other shares), its inner sequences too."""
    run = document["run"]
    if run is not None and type(run) is not int:
        message = f"a share's run is {run!r}"
        raise WireError(message)
    return JobShare(
        job,
        run,
        tuple(int(ts) for ts in document["times"]),
        tuple(tuple(row) for row in document["seen"]),
        tuple(
            (*row[:4], tuple(row[4]), tuple(row[5]), tuple(row[6]), tuple(row[7]))
            for row in document["conns"]
        ),
        tuple(part_of_row(row) for row in document["parts"]),
        tuple(part_of_row(row) for row in document["opens"]),
        tuple((str(comm), int(ns)) for comm, ns in document["finished"]),
        tuple((str(node), int(ns)) for node, ns in document["agents"]),
        tuple(
            (*row[:3], tuple(row[3]), tuple(row[4]), tuple(row[5]), tuple(row[6]), tuple(row[7]))
            for row in document["spans"]
        ),
        tuple((int(at), str(comm), int(size)) for at, comm, size in document["met"]),
    )

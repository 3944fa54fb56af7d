"""NCCL Inspector output (profiler plugin, NCCL 2.27+) as v1 collective messages.

Each output file holds JSON objects, one per collective per communicator (one a line, or
pretty-printed): ``header{id, rank, n_ranks}``, ``metadata{dump_timestamp_us, hostname}``,
``coll_perf{coll, coll_sn, coll_msg_size_bytes, coll_exec_time_us}`` and, verbose,
``event_trace_ts{coll_start_ts, kernel_events[].kernel_stop_ts}`` (microseconds).
The communicator id is the header's ``id`` (NCCL's commHash, the same on every member) and
``seq`` is ``coll_sn``. Without the verbose timestamps the record says only how long the
collective ran and when it was dumped: ``end_ns`` is the dump time and ``enter_ns`` that
minus the execution time, so durations are right and absolute times are an upper bound.
NCCL does not know the job's global rank: it is taken as the rank in the communicator,
exact for the job-wide communicator.

`InspectorSource` tails a dump folder: it reads what was appended to each file since the
last round (a partial object at the end waits for the next round), at most
`MAX_ROUND_BYTES` a round. Every read is bounded (`producers.bounded_read`): a record nested
deeper than a few levels, longer than a MiB, or a binary file is skipped with one line.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.bounded_read import (
    JsonObjectFile,
    ProblemLines,
    numbered,
    short_reason,
    split_json,
)
from producers.sources import Reading
from schemas.base import MAX_ID_CHARS, MAX_ITEMS
from schemas.messages import Collective, OpName, Ops

NS_PER_US = 1_000
MAX_INT64 = 2**63 - 1
_COLL: dict[str, OpName] = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "reducescatter": "reducescatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "alltoall": "alltoall",
}  # point-to-point records name no peer: they cannot go to a pair's communicator
# What the agent reads of one file per round; the rest waits for the next rounds.
MAX_ROUND_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class InspectorOp:
    """One collective of one rank, from one inspector record."""

    comm: str
    comm_size: int
    rank: int
    seq: int
    op: OpName
    nbytes: int
    enter_ns: int
    end_ns: int


def parse_record(record: Any) -> InspectorOp:
    """One inspector JSON object as an operation; ValueError with the reason otherwise."""
    try:
        header, perf, meta = record["header"], record["coll_perf"], record["metadata"]
        coll = str(perf["coll"]).lower()
        op = _COLL.get(coll)
        if op is None:
            message = f"collective {perf['coll']!r} is not a v1 operation"
            raise ValueError(short_reason(message))
        exec_ns = int(float(perf["coll_exec_time_us"]) * NS_PER_US)
        trace = perf.get("event_trace_ts")
        if isinstance(trace, dict) and "coll_start_ts" in trace:
            enter = int(trace["coll_start_ts"]) * NS_PER_US
            stops = [int(k["kernel_stop_ts"]) for k in trace.get("kernel_events", [])]
            end = max(stops) * NS_PER_US if stops else enter + exec_ns
        else:
            end = int(meta["dump_timestamp_us"]) * NS_PER_US
            enter = end - exec_ns
        result = InspectorOp(
            comm=str(header["id"]),
            comm_size=int(header["n_ranks"]),
            rank=int(header["rank"]),
            seq=int(perf["coll_sn"]),
            op=op,
            nbytes=int(perf["coll_msg_size_bytes"]),
            enter_ns=enter,
            end_ns=max(end, enter),
        )
    except (KeyError, TypeError, AttributeError, OverflowError) as error:
        message = f"missing or wrong field ({type(error).__name__}: {short_reason(error)})"
        raise ValueError(message) from None
    if result.comm_size < 1 or not 0 <= result.rank < result.comm_size or result.seq < 0:
        message = f"rank {result.rank} of {result.comm_size}, coll_sn {result.seq}"
        raise ValueError(short_reason(message))
    if result.nbytes < 0 or result.enter_ns < 0:
        message = "negative size or time"
        raise ValueError(message)
    if max(result.comm_size, result.seq, result.nbytes, result.end_ns) > MAX_INT64:
        message = "a number beyond 64 bits"
        raise ValueError(message)
    if not 1 <= len(result.comm) <= MAX_ID_CHARS:
        message = f"communicator id of {len(result.comm)} characters"
        raise ValueError(message)
    return result


def split_objects(text: str, final: bool = False) -> tuple[list[Any], int, list[str]]:
    """The complete JSON objects at the start of ``text``, the characters they used, errors.

    A syntax error, or an object nested too deep or too long, skips to the next line; unless
    ``final``, an object cut off at the end is left unread (`producers.bounded_read`).
    """
    objects, used, errors = split_json(text, final)
    return objects, used, numbered(text, errors)


def read_records(
    stream: JsonObjectFile, final: bool = False
) -> tuple[list[InspectorOp], list[str], list[str]]:
    """The operations of the records appended to a file since the last read, what could not
    be read as JSON and the records skipped, one line each (`MAX_PROBLEM_LINES` at most)."""
    objects, unreadable = stream.read(final=final, max_bytes=None if final else MAX_ROUND_BYTES)
    skipped = ProblemLines()
    ops: list[InspectorOp] = []
    for obj in objects:
        try:
            ops.append(parse_record(obj))
        except ValueError as error:
            skipped.add(f"{stream.path}: record skipped: {error}")
    return ops, unreadable, skipped.done(str(stream.path))


def to_messages(
    ops: list[InspectorOp], job: str, ts_ns: int, node: str | None = None
) -> list[Collective]:
    """One message per communicator and rank with its operations in ``seq`` order."""
    grouped: dict[tuple[str, int, int], list[InspectorOp]] = defaultdict(list)
    for op in ops:
        grouped[(op.comm, op.comm_size, op.rank)].append(op)
    messages = []
    for (comm, size, rank), items in grouped.items():
        items.sort(key=lambda op: op.seq)
        for first in range(0, len(items), MAX_ITEMS):
            part = items[first : first + MAX_ITEMS]
            messages.append(
                Collective.of(
                    job=job,
                    comm=comm,
                    comm_size=size,
                    rank=rank,
                    global_rank=rank,
                    node=node,
                    ts_ns=max(ts_ns, max(op.end_ns for op in part)),
                    ops=Ops(
                        seq=tuple(op.seq for op in part),
                        op=tuple(op.op for op in part),
                        bytes=tuple(op.nbytes for op in part),
                        enter_ns=tuple(op.enter_ns for op in part),
                        end_ns=tuple(op.end_ns for op in part),
                    ),
                )
            )
    return messages


class InspectorSource:
    """Tails the inspector's dump folder; each round, the records appended since the last."""

    def __init__(
        self, folder: Path, job: str, node: str | None = None, interval_s: float = 1.0
    ) -> None:
        self.name = "nccl-inspector"
        self.interval_s = interval_s
        self.folder, self.job, self.node = folder, job, node
        self._files: dict[Path, JsonObjectFile] = {}
        self._heartbeat_for: dict[tuple[str, int, int], None] = {}

    def read(self, now_ns: int) -> Reading:
        """Records appended since the last round; a heartbeat for quiet communicators."""
        reading = Reading()
        ops: list[InspectorOp] = []
        paths = sorted(self.folder.rglob("*")) if self.folder.is_dir() else []
        files = [path for path in paths if path.is_file()]
        # A file that went away is forgotten; one that comes back is read from its start.
        self._files = {path: self._files.get(path) or JsonObjectFile(path) for path in files}
        for stream in self._files.values():
            file_ops, unreadable, skipped = read_records(stream)
            ops.extend(file_ops)
            reading.problems.extend(unreadable + skipped)
        messages = to_messages(ops, self.job, now_ns, self.node)
        busy = {(m.comm, m.comm_size, m.rank) for m in messages}
        for key in busy:
            self._heartbeat_for[key] = None
        for comm, size, rank in self._heartbeat_for:
            if (comm, size, rank) not in busy:
                messages.append(to_heartbeat(self.job, comm, size, rank, now_ns, self.node))
        reading.messages.extend(messages)
        return reading

    def close(self) -> None:
        """Nothing is held open between rounds."""


def to_heartbeat(
    job: str, comm: str, size: int, rank: int, ts_ns: int, node: str | None
) -> Collective:
    """A message with empty ops: the rank is alive and issued nothing new."""
    return Collective.of(
        job=job,
        comm=comm,
        comm_size=size,
        rank=rank,
        global_rank=rank,
        node=node,
        ts_ns=ts_ns,
        ops=Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=()),
    )

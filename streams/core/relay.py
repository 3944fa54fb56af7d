"""The stages of one job's detection on Kafka, without Kafka: what each side does with a
record (issue 34). The Faust app (`streams.split_app`) only moves their records.

- `Forwarder` (where the job-keyed collective partition is read): each report goes on,
  undecoded, keyed by its job and node, to a node stage's partition; before a report whose
  event time enters a new tick, a barrier mark goes to every node-stage partition
  (`streams.core.barriers`).
- `NodeSide` (where node-stage partitions are read): decodes and takes the reports into one
  `NodeStage` per partition; at a barrier mark hands on the job's share, numbered by its
  partition and the barrier; keeps each job's state in a snapshot taken right then.
- `JobSide` (where the job-keyed shares are read): the gate; barriers let through go to
  the job stage (`Engine.on_barrier`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from schemas.codec import RejectCode, Rejection
from schemas.messages import Collective, Collectives
from schemas.records import Rejected, decode_record
from streams.core.barriers import NO_BARRIER, Barrier, BarrierMarks, ShareGate
from streams.core.comm import NOT_YET
from streams.core.share_wire import (
    BARRIER,
    FORGET,
    RUN,
    Mark,
    ShareRecord,
    WireError,
    decode_share,
    encode_mark,
)
from streams.core.split import NodeStage

_KIND = re.compile(rb'"kind"\s*:\s*"([a-z_]*)"')
_NODE = re.compile(rb'"node"\s*:\s*"([^"\\]*)"')
_JOB = re.compile(rb'"job"\s*:\s*"([^"\\]*)"')
_TS = re.compile(rb'"ts_ns"\s*:\s*(\d{1,19})\b')
COLLECTIVE_KINDS = (b"collective", b"collectives")


def route(line: bytes) -> tuple[str, int] | None:
    """A collective line's routing key (its first node, else its job) and the largest
    ``ts_ns`` in it; None for any other line (or one without a key), read off the text
    without decoding it."""
    kind = _KIND.search(line)
    if kind is None or kind.group(1) not in COLLECTIVE_KINDS:
        return None
    key = _NODE.search(line) or _JOB.search(line)
    if key is None:
        return None
    latest = max((int(ts) for ts in _TS.findall(line)), default=NOT_YET)
    return key.group(1).decode("utf-8", "replace"), latest


def job_of(line: bytes, fallback: str) -> str:
    """The first ``job`` a line names (``fallback``, its record's key, when none)."""
    found = _JOB.search(line)
    return fallback if found is None else found.group(1).decode("utf-8", "replace")


def report_key(job: str, node: str) -> bytes:
    """The key of a forwarded report: its job and node (a node's reports of a job stay
    together, in order)."""
    return orjson.dumps([job, node])


def job_of_key(key: bytes) -> str | None:
    """The job a forwarded report's key names (None: not such a key)."""
    try:
        decoded = orjson.loads(key)
    except orjson.JSONDecodeError:
        return None
    if isinstance(decoded, list) and len(decoded) == 2 and isinstance(decoded[0], str):
        return decoded[0]
    return None


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A record for the node stages' topic, for ``partition``: a forwarded report (the
    partition of its key) or a mark."""

    key: bytes
    value: bytes
    partition: int
    mark: bool = False


class Forwarder:
    """Reports on to the node stages; barrier marks before a report enters a new tick.

    A job's barriers are marked only into the partitions its reports went to (its
    *holders*): a small job's reports reach a partition or two, and marking each of its
    barriers into every partition cost a mark, a share back and a snapshot per partition,
    several times the job's own records. ``place`` is the partition of a forwarded
    record's key. ``recall`` gives a job's holders as the forwarder before this one kept
    them (a table), asked the first time a job is met: a forwarder restarted from its
    last commit must not mark fewer partitions than the one before it did, or a node
    stage holding the job's state would wait for a mark that never comes. Each time a job's
    holders grow they are noted in ``grown``, for the runtime to keep."""

    def __init__(
        self,
        tick_ns: int,
        partitions: int,
        place: Callable[[bytes], int],
        recall: Callable[[str], Iterable[int]] = lambda _job: (),
    ) -> None:
        self.marks = BarrierMarks(tick_ns)
        self.partitions = partitions
        self._place = place
        self._recall = recall
        self._holders: dict[str, set[int]] = {}
        self.grown: list[tuple[str, tuple[int, ...]]] = []  # (job, its holders now)
        # job -> when (wall clock, seconds) its latest report was forwarded, while no
        # barrier was marked after it
        self._latest_s: dict[str, float] = {}
        self.event_ns = NOT_YET  # the event time of the latest record forwarded (a report's)

    def forward(self, raw: bytes, key: str, now_s: float = 0.0) -> list[Outgoing]:
        """One record of the collective topic (``key``: its Kafka key, the job), forwarded
        at ``now_s`` (wall clock)."""
        job = job_of(raw, key)
        self._latest_s[job] = now_s
        routed = route(raw)
        self.event_ns = NOT_YET if routed is None else routed[1]
        if routed is None:
            # Not a report by its text: the node stage decodes it, and dead-letters it
            # with the decoder's own reason.
            return [self._report(job, "", raw)]
        node, latest = routed
        out: list[Outgoing] = []
        if latest != NOT_YET:
            barrier = self.marks.due(job, latest)
            if barrier is not None:
                out.extend(self.to_holders(Mark(BARRIER, job, barrier)))
        out.append(self._report(job, node, raw))
        return out

    def _report(self, job: str, node: str, raw: bytes) -> Outgoing:
        key = report_key(job, node)
        partition = self._place(key)
        holders = self.holders_of(job)
        if partition not in holders:
            holders.add(partition)
            self.grown.append((job, tuple(sorted(holders))))
        return Outgoing(key, raw, partition)

    def holders_of(self, job: str) -> set[int]:
        """The partitions ``job``'s reports went to (recalled the first time)."""
        holders = self._holders.get(job)
        if holders is None:
            recalled = {p for p in self._recall(job) if 0 <= p < self.partitions}
            holders = self._holders[job] = recalled
        return holders

    def silent(self, now_s: float, after_s: float) -> list[Outgoing]:
        """Barrier marks for the jobs whose reports went silent ``after_s`` ago (wall
        clock) with no barrier after them: what the node stages took of them would wait
        there for the next report otherwise (a job that stopped reporting, the end of a
        backlog)."""
        out: list[Outgoing] = []
        for job, latest in list(self._latest_s.items()):
            if now_s - latest < after_s:
                continue
            del self._latest_s[job]
            barrier = self.marks.next(job)
            if barrier is not None:
                out.extend(self.to_holders(Mark(BARRIER, job, barrier)))
        return out

    def forget(self, job: str) -> None:
        """The job stopped: its barriers start again with its next report, and so do the
        partitions they are marked into."""
        self.marks.forget(job)
        self._latest_s.pop(job, None)
        self._holders[job] = set()

    def drop(self, jobs: Iterable[str]) -> None:
        """These jobs' collective partitions went to another worker: what was kept of
        their holders is recalled again if they come back."""
        for job in jobs:
            self._holders.pop(job, None)

    def jobs(self) -> list[str]:
        """The jobs whose holders it keeps."""
        return list(self._holders)

    def to_holders(self, mark: Mark) -> list[Outgoing]:
        """A barrier mark for the partitions the job's reports went to, naming them."""
        sources = tuple(sorted(self.holders_of(mark.job)))
        marked = Mark(mark.kind, mark.job, mark.number, sources)
        value = encode_mark(marked)
        key = mark.job.encode()
        return [Outgoing(key, value, p, mark=True) for p in sources]

    def to_all(self, mark: Mark) -> list[Outgoing]:
        """A mark for every node-stage partition."""
        value = encode_mark(mark)
        key = mark.job.encode()
        return [Outgoing(key, value, p, mark=True) for p in range(self.partitions)]


class NodeSide:
    """The node stages of the node-stage partitions a worker holds, one per partition."""

    def __init__(self) -> None:
        self._stages: dict[int, NodeStage] = {}
        # (partition, job) -> the latest barrier handed on, and the offset of its mark
        self._marked: dict[tuple[int, str], tuple[int, int]] = {}
        # (partition, job) -> the offset of its first record that no snapshot holds yet
        self._unsaved: dict[tuple[int, str], int] = {}

    def stage(self, partition: int) -> NodeStage:
        """The node stage of a partition."""
        stage = self._stages.get(partition)
        if stage is None:
            stage = self._stages[partition] = NodeStage()
        return stage

    def on_report(
        self, partition: int, offset: int, raw: bytes, job: str, position: int
    ) -> list[Rejected]:
        """A forwarded record of ``job`` at ``offset``, from ``position`` in the job's own
        partition (the job stage meets its groups in that order, however the reports were
        spread): its reports taken (a record a restored snapshot holds already is skipped);
        those rejected, for dead letters."""
        key = (partition, job)
        done = self._marked.get(key)
        if done is not None and offset <= done[1]:
            return []
        self._unsaved.setdefault(key, offset)
        stage = self.stage(partition)
        rejected: list[Rejected] = []
        for result in decode_record(raw, "collective"):
            if isinstance(result, Rejected):
                rejected.append(result)
            elif isinstance(result, Collective | Collectives) and result.job == job:
                stage.on_message(result, position)
            else:
                named = getattr(result, "job", None)
                detail = f"job {named!r} where the record's text first names {job!r}"
                rejection = Rejection(RejectCode.INCONSISTENT, "job", detail)
                rejected.append(Rejected(rejection, raw))
        return rejected

    def on_mark(self, partition: int, offset: int, mark: Mark) -> ShareRecord | None:
        """A mark: at a barrier the job's share (None: one handed on already)."""
        stage = self.stage(partition)
        key = (partition, mark.job)
        done = self._marked.get(key)
        if done is not None and offset <= done[1]:
            return None  # read again after a restart: its snapshot holds it
        if mark.kind != BARRIER:
            self._unsaved.setdefault(key, offset)
            if mark.kind == RUN:
                stage.on_run(mark.job, mark.number)
            elif mark.kind == FORGET:
                stage.forget(mark.job)
            return None
        if done is not None and mark.number <= done[0]:
            return None
        share, latest = stage.barrier_of(mark.job)
        self._marked[key] = (mark.number, offset)
        return ShareRecord(mark.job, partition, mark.number, latest, share, mark.sources)

    def saved(self, partition: int, job: str) -> None:
        """The job's snapshot was kept right after its latest barrier here: it holds
        everything read of the job so far. A barrier whose snapshot is not kept (they are
        kept at most so often) leaves the resume offset where it was: a restarted worker
        then reads more again, and hands on again the shares the job stage drops."""
        self._unsaved.pop((partition, job), None)

    def resume_offset(self, partition: int, next_offset: int) -> int:
        """Where a restarted worker reads a partition again from (what it may commit): the
        first record some job's snapshot does not hold; ``next_offset`` when all do."""
        pending = [offset for (p, _), offset in self._unsaved.items() if p == partition]
        return min(pending, default=next_offset)

    def snapshot(self, partition: int, job: str) -> dict[str, Any]:
        """A job's state in a partition's node stage, right after its barrier: what a
        restarted worker goes on from (and the mark's offset: what it read already)."""
        barrier, offset = self._marked.get((partition, job), (NO_BARRIER, -1))
        state = self.stage(partition).snapshot([job]).get(job)
        return {"barrier": barrier, "offset": offset, "stage": state}

    def restore(self, partition: int, job: str, snapshot: dict[str, Any]) -> None:
        """Take a job's state in a partition over from its snapshot."""
        state = snapshot.get("stage")
        if state is not None:
            self.stage(partition).restore(job, state)
        self._marked[(partition, job)] = (int(snapshot["barrier"]), int(snapshot["offset"]))

    def revoke(self, partition: int) -> None:
        """The partition went to another worker: its stage with it."""
        self._stages.pop(partition, None)
        for held in (self._marked, self._unsaved):
            for key in [key for key in held if key[0] == partition]:
                del held[key]


class JobSide:
    """The job stage's gate over the node stages' shares."""

    def __init__(self, sources: int) -> None:
        self.gate = ShareGate(sources)

    def on_share(self, raw: bytes) -> list[Barrier]:
        """A share record: the barriers it completes; `WireError` for a bad record."""
        record = decode_share(raw)
        return self.offer(record)

    def offer(self, record: ShareRecord) -> list[Barrier]:
        """A decoded share record: the barriers it completes."""
        sources = self.gate.sources
        if not 0 <= record.source < sources:
            message = f"a share from source {record.source} of {sources}"
            raise WireError(message)
        if record.sources is not None and any(not 0 <= s < sources for s in record.sources):
            message = f"a share of a barrier marked into {record.sources}, of {sources}"
            raise WireError(message)
        job, source, barrier = record.job, record.source, record.barrier
        return self.gate.offer(job, source, barrier, record.share, record.latest_ns, record.sources)

"""The live runtime around a detection stage: event time from the messages, advanced by wall
time while the stream is silent, so hangs and node_down fire even when nothing arrives; late
measurements dropped; the stage's state kept in its tables (`streams.durable`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.base import C4Model
from schemas.messages import Collective, Diagnosis, Gpu, Job, Link
from streams.core.engine import DATA_KINDS
from streams.core.split import JobShare
from streams.core.stage import JOB, DetectionStage, StateKey
from streams.durable import SnapshotStore
from streams.metrics import StreamMetrics

NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class RecordTaken:
    """What one input record's messages changed: the diagnoses, and the messages the stage
    failed on (their index in the record, the error) for dead letters."""

    found: list[Diagnosis]
    failed: list[tuple[int, Exception]]


@dataclass(slots=True)
class LiveCounters:
    """What the live path took and what it dropped as too late."""

    messages: int = 0
    too_late: int = 0
    diagnoses: int = 0


class InputLag:
    """Which of a worker's input partitions still hold records it has not processed.

    The engine's `InputProgress` for a live worker: a partition is behind while the next
    offset to process is below its high watermark (the broker's end of the log, as the last
    fetch said). Kafka orders records only within a partition; a backlog published in one
    burst reaches the worker topic by topic and partition in any order, so a conclusion
    that joins a job's reports with a node's link reports, or a part with its job's
    placement, waits while the other side is behind (as Kafka Streams waits for a task's
    lagging partitions before it processes the others in time order). Scaled out, the job
    topic's partitions owned by other workers count too: their placements arrive through the
    shared facts, behind until those hold them up to the partition's end. Until the first
    measurement after an assignment everything counts as behind.

    Records not yet published cannot be seen as behind: a job's placement and collectives,
    keyed by the job, share a partition number, and that partition can lag the others in
    event time while it holds nothing to read (its producer or its broker slow, its part of
    a backlog still to come). So a job's placements also count as pending while one of the
    collective partitions read here is more than ``lag_slack_ns`` behind the latest event
    time seen, for at most ``idle_s`` wall seconds from when a conclusion first waited on
    it, as Kafka Streams' ``max.task.idle.ms`` waits for an empty partition before it
    processes the others ahead of it. A partition that stays empty (no job on it, a job
    that ended) costs that wait once, not at every finding.

    A measurement tells which partitions were behind when it was taken, so it answers only
    for the records processed by then. A burst that arrives after it (a backlog published
    while the worker waits, one partition far behind the others) is read in chunks that keep
    the worker busy, the timer's next measurement waiting: judged on the old one, a job's
    collectives read before the link reports of the same burst found every link partition
    caught up, and a stalled communicator was blamed on the wrong ports. So once an input
    partition's records run more than ``remeasure_ns`` of event time past what the last
    measurement covered (or a partition that held nothing then holds records), the
    measurement is ``stale``: the worker measures again before it goes on.
    """

    def __init__(
        self,
        partition_of: Callable[[str], int],
        *,
        lag_slack_ns: int = 5 * NS_PER_S,
        idle_s: float = 15.0,
        remeasure_ns: int = NS_PER_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._partition_of = partition_of
        self._behind: dict[str, frozenset[int]] | None = None
        self.processed: dict[Any, int] = {}  # topic partition -> next offset to process
        self.lag_slack_ns = lag_slack_ns
        self.idle_s = idle_s
        self.remeasure_ns = remeasure_ns
        self._monotonic = monotonic
        self._collective_parts: frozenset[int] = frozenset()  # read here, as last measured
        self._stream_ns: dict[int, int] = {}  # collective partition -> latest event time
        self._latest_ns = 0
        # (input kind, partition) -> its latest event time: now, and at the last measurement.
        self._partition_ns: dict[tuple[str, int], int] = {}
        self._measured_ns: dict[tuple[str, int], int] = {}
        self.stale = True  # nothing measured yet
        # Since when a conclusion waits on these lagging collective partitions (wall time).
        self._idle_wait: tuple[frozenset[int], float] | None = None

    def record(self, tp: Any, offset: int, kind: str = "", ts_ns: int = 0) -> None:
        """A record of ``tp`` at ``offset`` (of input ``kind``, event time ``ts_ns``) was
        processed."""
        if offset >= self.processed.get(tp, 0):
            self.processed[tp] = offset + 1
        if kind not in ("collective", "link", "gpu") or ts_ns <= 0:
            return
        partition = int(getattr(tp, "partition", 0))
        if kind == "collective" and ts_ns > self._stream_ns.get(partition, 0):
            self._stream_ns[partition] = ts_ns
        if ts_ns > self._latest_ns:
            self._latest_ns = ts_ns
        where = (kind, partition)
        if ts_ns > self._partition_ns.get(where, 0):
            self._partition_ns[where] = ts_ns
            measured = self._measured_ns.get(where)
            if measured is None or ts_ns > measured + self.remeasure_ns:
                self.stale = True  # past what the last measurement answers for

    def update(
        self, behind: Mapping[str, set[int]], collective_parts: set[int] | None = None
    ) -> None:
        """The partitions (by input kind) found behind now; the collective topic's read here.
        Answers for every record processed so far (no longer ``stale``)."""
        self._behind = {kind: frozenset(parts) for kind, parts in behind.items()}
        if collective_parts is not None:
            self._collective_parts = frozenset(collective_parts)
        self._measured_ns = dict(self._partition_ns)
        self.stale = False

    def reset(self) -> None:
        """Partitions moved (a rebalance): unknown again until measured."""
        self._behind = None
        self._idle_wait = None
        self.stale = True

    def _pending(self, kind: str) -> frozenset[int] | None:
        return None if self._behind is None else self._behind.get(kind, frozenset())

    def placements_pending(self) -> bool:
        """Some partition of the job topic is behind (or not measured yet), or a collective
        partition lags in event time and has not been waited on for ``idle_s`` yet."""
        parts = self._pending("job")
        if parts is None or parts:
            return True
        lagging = frozenset(
            p
            for p in self._collective_parts
            if self._stream_ns.get(p, 0) < self._latest_ns - self.lag_slack_ns
        )
        if not lagging:
            self._idle_wait = None
            return False
        now = self._monotonic()
        if self._idle_wait is None or not lagging <= self._idle_wait[0]:
            # A partition fell behind that was not waited on yet: its wait starts now.
            self._idle_wait = (lagging, now)
        return now - self._idle_wait[1] < self.idle_s

    def hardware_behind(self) -> bool:
        """Some partition of the link topic is behind (or not measured yet)."""
        parts = self._pending("link")
        return parts is None or bool(parts)

    def hardware_pending(self, node: str) -> bool:
        """The link partition of ``node`` is held here and behind (or not measured yet)."""
        parts = self._pending("link")
        return parts is None or self._partition_of(node) in parts


class LiveDetection:
    """Feeds a detection stage from a live stream and ticks it from a timer.

    The one layer between the Faust app and the stage: it drives the stage only through
    `DetectionStage`, and with a ``store`` keeps each key's state in its tables (restored
    the first time this worker sees the key, written when a finding changes and
    periodically, handed over when a partition is revoked).

    ``clock_rate`` is event seconds per wall second: 1 for real clusters, more for a
    simulator replaying faster than real time. A measurement more than ``max_lateness_ns``
    older than the latest one of its own source (a job's reports from one node, a port's
    links, a GPU's) is counted and dropped: out of order beyond the bound, it would be judged
    against state that has moved on. Lateness is per key, as Kafka Streams keeps stream time
    per partition: a job whose partition lags behind the others (a backlog, an overloaded
    worker) is behind the worker's clock, not late, and its data is judged on its own time.
    A job's reports are keyed by node as well: each node's agent spools and replays on its
    own, so after an outage one node's backlog arrives behind another's, in order for its
    node, and is taken.
    """

    def __init__(
        self,
        stage: DetectionStage,
        *,
        clock_rate: float = 1.0,
        max_lateness_ns: int = 30 * NS_PER_S,
        silence_grace_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: StreamMetrics | None = None,
        store: SnapshotStore | None = None,
    ) -> None:
        self._stage = stage
        self.metrics = metrics or StreamMetrics()
        self.store = store
        self.clock_rate = clock_rate
        self.max_lateness_ns = max_lateness_ns
        # Gaps between fetched batches are not silence: only past this much wall time
        # without a message does the timer move event time on by itself.
        self.silence_grace_s = silence_grace_s
        self._monotonic = monotonic
        self._latest_event_ns = 0
        self._wall_at_latest = monotonic()
        self.counters = LiveCounters()
        self._per_kind: dict[str, Any] = {}
        self._ops_of: dict[str, Any] = {}  # the operations counter of each job
        # (kind, job, node) or (kind, port or GPU, "") -> the source's latest ts_ns
        self._latest_of: dict[tuple[str, str, str], int] = {}

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """One decoded message (`on_record` of one); an error of the stage is raised."""
        taken = self.on_record((message,))
        if taken.failed:
            raise taken.failed[0][1]
        return taken.found

    def on_record(self, messages: Sequence[C4Model]) -> RecordTaken:
        """One input record's decoded messages, in order: a key restored first if this
        worker just got it; a late message dropped, the rest to the stage; the keys' state
        saved if a finding changed. A message the stage fails on is given back with its
        error, the others go on.

        What is per record, not per message (a batch brings tens of messages, and this layer
        cost as much as the detectors' own work on them): the metrics, the processing time,
        the wall time of the latest event, a key asked to be restored once while it repeats.
        """
        stage, store = self._stage, self.store
        found: list[Diagnosis] = []
        failed: list[tuple[int, Exception]] = []
        counted: dict[str, int] = {}
        operations: dict[str, int] = {}
        latest_ns = 0
        last_key: StateKey | None = None
        began = time.perf_counter()
        for index, message in enumerate(messages):
            try:
                if store is not None:
                    key = stage.key_of(message)
                    if key is not None and key != last_key:
                        store.before_message(stage, key)
                        last_key = key
                ts_ns = self._admitted_at(message)
                if ts_ns is None:
                    continue
                kind = str(getattr(message, "kind", ""))
                counted[kind] = counted.get(kind, 0) + 1
                if isinstance(message, Collective) and message.ops.seq:
                    operations[message.job] = operations.get(message.job, 0) + len(message.ops.seq)
                if ts_ns > latest_ns:
                    latest_ns = ts_ns
                found.extend(stage.on_message(message))
            except Exception as error:  # noqa: BLE001 - one bad message must not stop the rest
                failed.append((index, error))
        self._count(counted, operations, latest_ns)
        self.metrics.processing.observe(time.perf_counter() - began)
        if found:
            self._observe(found)
            if store is not None:
                store.after_message(stage, found)
        return RecordTaken(found, failed)

    def adopt(self, key: StateKey) -> None:
        """Restore a key from the tables now if this worker just got it (before what the
        runtime reads of its state: the stages on Kafka read which barrier it holds)."""
        if self.store is not None:
            self.store.before_message(self._stage, key)

    def on_barrier(self, job: str, shares: list[JobShare], latest_ns: int) -> list[Diagnosis]:
        """A barrier of the stages on Kafka let through for ``job`` (`streams.split_app`):
        the job's key restored first if this worker just got it, what the node stages
        handed on taken, its state saved if a finding changed."""
        stage, store = self._stage, self.store
        key = StateKey(JOB, job)
        if store is not None:
            store.before_message(stage, key)
        began = time.perf_counter()
        found = stage.on_barrier(shares, latest_ns)
        reports = sum(len(share.times) for share in shares)
        if reports:
            operations = sum(len(row[3]) for share in shares for row in share.spans)
            self._count({"collective": reports}, {job: operations}, max(latest_ns, 0))
        self.metrics.processing.observe(time.perf_counter() - began)
        if found:
            self._observe(found)
            if store is not None:
                store.after_message(stage, found)
        return found

    def _admitted_at(self, message: C4Model) -> int | None:
        """The event time a message moves the clock to (0: a fact, which never does); None
        for a measurement too late to take (counted)."""
        if not isinstance(message, DATA_KINDS):
            if isinstance(message, Job) and message.state == "stopped":
                ended = [k for k in self._latest_of if k[:2] == ("collective", message.job)]
                for key in ended:
                    del self._latest_of[key]
            return 0  # a fact (placement, route plan): always taken
        ts_ns = int(message.ts_ns)
        key = _key_of(message)
        latest = self._latest_of.get(key, ts_ns)
        if ts_ns < latest - self.max_lateness_ns:
            self.counters.too_late += 1
            self.metrics.late.inc()
            return None
        if ts_ns >= latest:  # also a key seen for the first time (latest is ts_ns)
            self._latest_of[key] = ts_ns
        return ts_ns

    def _count(self, counted: dict[str, int], operations: dict[str, int], latest_ns: int) -> None:
        """The messages and operations a record brought, and its latest event time."""
        for kind, count in counted.items():
            self.counters.messages += count
            counter = self._per_kind.get(kind)
            if counter is None:  # label lookups cost more than the increment: once per kind
                counter = self._per_kind[kind] = self.metrics.messages.labels(kind)
            counter.inc(count)
        for job, count in operations.items():
            per_job = self._ops_of.get(job)
            if per_job is None:
                per_job = self._ops_of[job] = self.metrics.operations.labels(job)
            per_job.inc(count)
        if latest_ns > self._latest_event_ns:
            self._latest_event_ns = latest_ns
            self._wall_at_latest = self._monotonic()

    def _observe(self, found: list[Diagnosis]) -> None:
        self.counters.diagnoses += len(found)
        self.metrics.record_diagnoses(found)
        self._export_progress()

    def _export_progress(self) -> None:
        self.metrics.event_time.set(self._stage.now_ns / NS_PER_S)
        self.metrics.tracked_jobs.set(len(self._stage.keys(JOB)))

    def on_timer(self) -> list[Diagnosis]:
        """Take over what the tables hold for newly owned keys; advance event time by the
        wall time since the latest message and run due checks; save.

        What waited for other inputs to catch up (the stage's held jobs and deferred
        hardware findings) is judged again on every tick, silent or not.
        """
        stage, store = self._stage, self.store
        if store is not None:
            store.adopt_owned(stage)
        found = self._tick(stage)
        if store is not None:
            store.after_timer(stage, found)
        return found

    def _tick(self, stage: DetectionStage) -> list[Diagnosis]:
        if self._latest_event_ns == 0:
            return []
        self._export_progress()
        elapsed_s = self._monotonic() - self._wall_at_latest - self.silence_grace_s
        # Not silent: a time behind the clock, which moves nothing.
        now_ns = 0
        if elapsed_s > 0:
            now_ns = self._latest_event_ns + int(elapsed_s * self.clock_rate * NS_PER_S)
        found = stage.on_timer(now_ns)
        if found:
            self._observe(found)
        return found

    def on_revoked(self, keys: Iterable[StateKey]) -> None:
        """Partitions went to another worker: their keys handed over (saved, dropped)."""
        if self.store is not None:
            self.store.revoke(self._stage, keys)
        else:
            for key in keys:
                self._stage.drop(key)


def _key_of(message: Collective | Link | Gpu) -> tuple[str, str, str]:
    """What a measurement's lateness is judged against: its job's reports from its node (each
    node's agent delivers, spools and replays on its own), its port or its GPU."""
    if isinstance(message, Collective):
        return "collective", message.job, message.node or ""
    if isinstance(message, Link):
        return "link", f"{message.node}/{message.port}", ""
    return "gpu", f"{message.node}/{message.gpu}", ""

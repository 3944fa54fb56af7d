"""The detection app: decoding agents feed the engine; state in changelog-backed tables.

What runs where, with several workers in one consumer group:
- every input topic has the same partition count and is keyed by job (collective, job) or
  node (link, gpu), so Faust gives partition p of all of them to one worker: a job's state,
  and a node's, live only with its partition;
- detection is one stage (`streams.core.stage.DetectionStage`, the engine), driven by the
  live runtime (`streams.live.LiveDetection`): its state is snapshotted per key into the
  ``job-state`` and ``node-state`` tables (changelog topics, same partitioning), so a
  restarted worker or the next owner after a rebalance goes on from it (`streams.durable`);
- placements, port health and route plans go to the ``shared-facts`` global table that every
  worker holds (`streams.shared`);
- each worker sends its jobs' changed slow paths to the one-partition ``fabric-paths`` topic,
  where the worker that owns it runs the fabric correlator (`streams.core.fabric.FabricHub`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
import orjson
from aiokafka.partitioner import murmur2
from faust.streams import current_event
from faust.types import TP, TableT

from schemas.base import C4Model
from schemas.codec import encode
from schemas.files import Topology
from schemas.messages import Diagnosis
from schemas.topics import ALL_TOPICS, FABRIC_KEY
from streams.core.engine import Engine
from streams.core.fabric import FabricHub
from streams.core.findings import OpenFinding
from streams.core.params import DetectorParams
from streams.core.slowpath import path_of, path_row
from streams.core.snapshot import SnapshotError, base_key, read_snapshot, write_snapshot
from streams.core.stage import JOB, NODE, StateKey
from streams.durable import SnapshotStore
from streams.intake_app import INPUT_TOPICS, create_app
from streams.live import InputLag, LiveDetection
from streams.metrics import StreamMetrics
from streams.shared import TableFacts
from streams.split_app import SplitStages

log = logging.getLogger(__name__)

LAG_EVERY_S = 2.0
# The job topic's end offsets, asked of the broker each tick: not longer than a tick or two.
HIGHWATERS_TIMEOUT_S = 1.0
FABRIC_STATE_KEY = FABRIC_KEY.encode()


@dataclass(frozen=True, slots=True)
class DetectionConfig:
    """How a detection worker runs: its group, topics, clock and detector settings."""

    app_id: str
    broker: str
    partitions: int = 8
    topic_names: Mapping[str, str] = field(default_factory=dict)
    params: DetectorParams = field(default_factory=DetectorParams)
    job_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    topology: Topology | None = None
    clock_rate: float = 1.0
    tick_s: float = 0.5
    snapshot_interval_s: float = 1.0
    web_port: int | None = None
    web_bind: str = "127.0.0.1"
    app_settings: Mapping[str, Any] = field(default_factory=dict)
    # One job's detection spread over the workers (`streams.split_app`): node stages on an
    # internal topic keyed by job and node, the job stage fed their shares.
    split: bool = False


def partition_of(key: str | bytes, partitions: int) -> int:
    """The partition Kafka's murmur2 partitioner (Java, aiokafka, our producers) picks."""
    raw = key.encode() if isinstance(key, str) else key
    return int(murmur2(raw) & 0x7FFFFFFF) % partitions


class KeyPartitionedTable(faust.Table):  # type: ignore[type-arg]
    """A table whose writes go to the changelog partition of their key (murmur2).

    So a job's state lands in the partition of the job's messages, whether it is written
    while processing one of them or from the timer; computed here rather than by the
    producer, which cannot place a key before it has the changelog topic's metadata. The
    parts of a large snapshot go with their key.
    """

    def partition_for_key(self, key: Any) -> int:
        if isinstance(key, bytes):
            key = base_key(key)
        return partition_of(key, self.changelog_topic.partitions or self.app.conf.topic_partitions)


class KeyPartitionedGlobalTable(faust.GlobalTable):
    """A global table, placed like `KeyPartitionedTable`."""

    def partition_for_key(self, key: Any) -> int:
        return partition_of(key, self.changelog_topic.partitions or self.app.conf.topic_partitions)


@dataclass(slots=True)
class DetectionWorker:
    """The pieces of one detection worker, for the command line and the tests."""

    app: faust.App
    detection: LiveDetection
    hub: FabricHub
    metrics: StreamMetrics


@dataclass(frozen=True, slots=True)
class WorkerTopics:
    """A worker's topic names by kind, and which partition a key's records go to."""

    names: Mapping[str, str]
    partitions: int
    kind_of_topic: Mapping[str, str]  # input topic name -> its kind
    fabric_paths: str  # the internal topic of the jobs' changed slow paths

    @classmethod
    def of(cls, config: DetectionConfig) -> WorkerTopics:
        """The topics of a worker: the v1 names, renamed as the config says."""
        names = {topic.kind: topic.name for topic in ALL_TOPICS}
        names.update(config.topic_names)
        kind_of_topic = {names[topic.kind]: topic.kind for topic in INPUT_TOPICS}
        return cls(names, config.partitions, kind_of_topic, f"{config.app_id}-fabric-paths")

    def partition(self, key: str | bytes) -> int:
        """The partition of a key in every input topic."""
        return partition_of(key, self.partitions)

    def owner_tp(self, key: StateKey) -> TP:
        """The topic partition whose owner holds a job's (or a node's) state."""
        topic = self.names["collective"] if key.kind == JOB else self.names["link"]
        return TP(topic, self.partition(key.id))

    def revoked_of(self, revoked: Iterable[TP], kind: str) -> set[int]:
        """The partitions of the ``kind`` topic among revoked topic partitions."""
        return {tp.partition for tp in revoked if tp.topic == self.names[kind]}


@dataclass(frozen=True, slots=True)
class StateTables:
    """The changelog-backed tables of a worker: raw bytes keys and values."""

    jobs: TableT[bytes, bytes]
    nodes: TableT[bytes, bytes]
    fabric: TableT[bytes, bytes]
    shared: TableT[bytes, bytes]  # a global table

    @classmethod
    def create(cls, app: faust.App, partitions: int) -> StateTables:
        """The app's tables (Faust creates their changelog topics)."""
        # bytes keys and values: raw on the changelog, so a key hashes to the same partition
        # as the job's (or node's) messages.
        raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes}
        job_states = app.Table("job-state", partitions=partitions, **raw)
        node_states = app.Table("node-state", partitions=partitions, **raw)
        fabric_state = app.Table("fabric-state", partitions=1, **raw)
        # One partition and a recovery buffer of one: Faust's advice for global tables
        # shared by several workers (larger settings can loop in recovery). Every worker
        # writes to it and must read the others' writes continuously, not only at start-up:
        # synchronize_all_active_partitions keeps its partition a standby everywhere.
        shared = app.GlobalTable(
            "shared-facts",
            partitions=1,
            recovery_buffer_size=1,
            synchronize_all_active_partitions=True,
            **raw,
        )
        return cls(job_states, node_states, fabric_state, shared)


def create_detection_app(
    config: DetectionConfig,
    metrics: StreamMetrics | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> DetectionWorker:
    """A Faust app that detects, keeps its state in tables and publishes diagnoses."""
    flow = DetectionFlow(config, metrics or StreamMetrics(), monotonic)
    return DetectionWorker(flow.app, flow.live, flow.hub, flow.metrics)


class DetectionFlow:
    """One detection worker at run time: records in, diagnoses and slow paths out.

    Its methods are the app's handlers: ``feed_record`` (every decoded input record), ``tick``
    (the timer), ``correlate`` (the agent of the ``fabric-paths`` topic) and ``forget``
    (partitions revoked). Built in dependency order: the app takes the handlers, the tables
    come from the app, the detection from the tables; no handler runs before the app starts.
    It holds the stage it built (the engine) for what the stage hands out besides diagnoses
    (placements, slow paths, open findings); the live runtime drives it.
    """

    def __init__(
        self, config: DetectionConfig, metrics: StreamMetrics, monotonic: Callable[[], float]
    ) -> None:
        if "datadir" in config.app_settings:
            # Faust creates only the last level of its data folder.
            Path(str(config.app_settings["datadir"])).mkdir(parents=True, exist_ok=True)
        self.metrics = metrics
        self._monotonic = monotonic
        self._lag_at = 0.0  # when consumer lag was last recorded (monotonic)
        self.topics = topics = WorkerTopics.of(config)
        self.lag = InputLag(topics.partition)
        # The job topic's partitions owned elsewhere whose placements the facts lacked at
        # the timer's last measurement (asked of the broker: only there); None before one.
        self._placements_elsewhere: set[int] | None = None
        self.split: SplitStages | None = None
        self.app = _app(config, topics, self.feed_record, metrics, self._forward)
        tables = StateTables.create(self.app, config.partitions)
        self.facts = TableFacts(tables.shared)
        self.stage = Engine(
            config.params,
            config.job_params,
            config.topology,
            shared=self.facts,
            local_fabric=False,
            progress=self.lag,
        )
        store = SnapshotStore(
            {JOB: tables.jobs, NODE: tables.nodes},
            self.owns,
            snapshot_interval_s=config.snapshot_interval_s,
            monotonic=monotonic,
            metrics=metrics,
        )
        self.live = LiveDetection(
            self.stage, clock_rate=config.clock_rate, metrics=metrics, store=store
        )
        self.hub = FabricHub(config.topology, config.params.tick_ns, config.params)
        if config.split:
            self.split = SplitStages(
                self.app,
                app_id=config.app_id,
                partitions=config.partitions,
                tick_ns=config.params.tick_ns,
                collective_topic=topics.names["collective"],
                deadletter_topic=topics.names["deadletter"],
                live=self.live,
                engine=self.stage,
                publish=self._send,
                metrics=metrics,
                place=topics.partition,
                forwarded=self._forwarded,
            )
        self._diagnoses = self.app.topic(
            topics.names["diagnosis"],
            key_serializer="raw",
            value_serializer="raw",
            partitions=config.partitions,
        )
        self._placements = self.app.topic(
            topics.names["job"],
            key_serializer="raw",
            value_serializer="raw",
            partitions=config.partitions,
        )
        # Internal: Faust creates it (one partition: the correlator runs in one place).
        self._fabric_paths = self.app.topic(
            topics.fabric_paths,
            key_serializer="raw",
            value_serializer="raw",
            partitions=1,
            internal=True,
        )
        self._fabric = _FabricSide(self.hub, tables.fabric, metrics)
        self.app.agent(self._fabric_paths, name=f"{config.app_id}.fabric")(self.correlate)
        self.app.timer(interval=config.tick_s)(self.tick)
        self.app.on_partitions_revoked.connect(self.forget)

    def _forwarded(self, tp: TP, offset: int, event_ns: int) -> None:
        """A collective record forwarded to the node stages (split): read, for the lag."""
        self.lag.record(tp, offset, "collective", max(event_ns, 0))
        if self.lag.stale:
            self.remeasure()

    async def _forward(self, stream: Any) -> None:
        """The collective topic's agent when split: the forwarder of `SplitStages`."""
        if self.split is None:
            message = "the forwarder runs only in a split worker"
            raise RuntimeError(message)
        await self.split.forward(stream)

    def owns(self, key: StateKey) -> bool:
        """Whether this worker holds the partition of a job or a node now."""
        return self.topics.owner_tp(key) in self.app.consumer.assignment()

    async def publish(self, found: list[Diagnosis]) -> None:
        """Send diagnoses to the diagnosis topic, keyed by job (or the fabric's key)."""
        for diagnosis in found:
            key = diagnosis.job if diagnosis.job is not None else FABRIC_KEY
            await self._diagnoses.send(key=key.encode(), value=encode(diagnosis))
        if found:
            self.export_findings()

    def export_findings(self) -> None:
        """The open findings of the partitions held here, for ``c4_finding_open``."""
        self.metrics.set_open_findings(self.stage.open_findings() + self._fabric.open_findings())

    async def feed_record(
        self, key: str | None, messages: list[C4Model]
    ) -> list[tuple[int, Exception]]:
        """One input record's decoded messages, in order: the record noted (its offset),
        its messages detected and their facts shared; what they found published after the
        last. Those that failed, for dead letters."""
        event = current_event()
        if event is not None:
            record = event.message
            latest_ns = max((int(getattr(m, "ts_ns", 0)) for m in messages), default=0)
            kind = self.topics.kind_of_topic.get(record.tp.topic, "")
            self.lag.record(record.tp, record.offset, kind, latest_ns)
        if self.lag.stale:
            self.remeasure()
        taken = self.live.on_record(messages)
        failed = list(taken.failed)
        for _, error in failed:
            log.error("detection failed on a message keyed %s", key, exc_info=error)
        gone = {index for index, _ in failed}
        for index, message in enumerate(messages):
            if index in gone:
                continue
            try:
                self.facts.learn(message, self.stage)
            except Exception as error:  # noqa: BLE001 - one bad message must not stop the rest
                log.exception("sharing the facts of a message keyed %s failed", key)
                failed.append((index, error))
        if self.split is not None:
            await self.split.on_facts(m for i, m in enumerate(messages) if i not in gone)
        await self._send(taken.found)
        return sorted(failed, key=lambda entry: entry[0])

    async def _send(self, found: list[Diagnosis]) -> None:
        """Publish diagnoses, then the placements assembled from member reports."""
        if found:
            await self.publish(found)
        for placement in self.stage.drain_placements():
            # Assembled from the ranks' reports: on the job topic for the action workers
            # (and back to this worker, where the same placement changes nothing).
            await self._placements.send(key=placement.job.encode(), value=encode(placement))

    async def correlate(self, stream: Any) -> None:
        """The ``fabric-paths`` agent: every worker's slow paths into the correlator."""
        async for value in stream:
            await self.publish(self._fabric.on_report(value))

    def remeasure(self) -> None:
        """Between ticks, when records came past what the last measurement answers for:
        which of this worker's partitions are behind now (the high watermarks its fetches
        brought), before those records are judged. What was cleared to go on is asked anew.
        Not before the timer measured once: until then everything counts as behind."""
        elsewhere = self._placements_elsewhere
        if elsewhere is None:
            return
        measured = own_progress(self.app.consumer, self.lag, self.topics.kind_of_topic, self.facts)
        if measured is None:
            return
        behind, collective_parts = measured
        behind["job"] |= elsewhere
        self.lag.update(behind, collective_parts)
        self.stage.on_progress()

    async def tick(self) -> None:
        """The timer: progress, the detectors' timers, changed slow paths, consumer lag."""
        topics = self.topics
        elsewhere = await _measure_progress(
            self.app, self.lag, topics.kind_of_topic, self.facts, topics.partitions
        )
        if elsewhere is not None:
            self._placements_elsewhere = elsewhere
        if self.split is not None:
            await self.split.on_timer()
        found = self.live.on_timer()
        await self.publish(found)
        self.export_findings()  # also what a takeover restored, a revocation dropped
        await self._report_paths()
        if self._monotonic() - self._lag_at >= LAG_EVERY_S:
            self._lag_at = self._monotonic()
            await _record_lag(self.app, self.metrics)

    async def _report_paths(self) -> None:
        """Send the jobs' slow paths that changed, and the clock, to the correlator."""
        changed = self.stage.drain_slow_paths()
        report = {
            "now_ns": self.stage.now_ns,
            "paths": {job: [path_row(p) for p in paths] for job, paths in changed.items()},
        }
        if report["now_ns"]:
            await self._fabric_paths.send(key=FABRIC_STATE_KEY, value=orjson.dumps(report))

    async def forget(self, sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        """Partitions revoked: hand their jobs, nodes (and the correlator) over."""
        revoked = args[0] if args else kwargs.get("revoked", set())
        topics = self.topics
        self.lag.reset()
        self.facts.forget_written()
        self._placements_elsewhere = None  # of the old assignment: the timer asks anew
        for kind, topic in ((JOB, "collective"), (NODE, "link")):
            gone = topics.revoked_of(revoked, topic)
            held = self.stage.keys(kind)
            self.live.on_revoked([key for key in held if topics.partition(key.id) in gone])
        if self.split is not None:
            self.split.revoked(revoked, topics.partition)
        if any(tp.topic == topics.fabric_paths for tp in revoked):
            self._fabric.revoke()
        self.export_findings()  # not one scrape more of what the next owner exports now


def _app(
    config: DetectionConfig,
    topics: WorkerTopics,
    feed: Callable[[str | None, list[C4Model]], Awaitable[list[tuple[int, Exception]]]],
    metrics: StreamMetrics,
    forward: Callable[[Any], Awaitable[None]],
) -> faust.App:
    """The Faust app of a worker: decoding agents that hand every input record's messages
    to ``feed`` (split: the collective topic's records to ``forward``, undecoded)."""
    return create_app(
        config.app_id,
        config.broker,
        partitions=config.partitions,
        topic_names=topics.names,
        record_handlers={topic.kind: feed for topic in INPUT_TOPICS},
        on_reject=lambda topic, rejection: metrics.rejected.labels(
            topic, rejection.code.value
        ).inc(),
        web_port=config.web_port,
        web_bind=config.web_bind,
        raw_agents={"collective": forward} if config.split else None,
        broker_config={
            "Table": KeyPartitionedTable,
            "GlobalTable": KeyPartitionedGlobalTable,
            # Larger fetches and agent buffers: +12% messages/s on 4 KiB collective
            # messages for about twice the memory (bench/bench_streams.py).
            "consumer_max_fetch_size": 8 * 1024 * 1024,
            "stream_buffer_maxsize": 16_384,
            **config.app_settings,
        },
    )


class _FabricSide:
    """The correlator behind the ``fabric-paths`` topic, its state in a one-key table."""

    def __init__(self, hub: FabricHub, table: Any, metrics: StreamMetrics) -> None:
        self.hub = hub
        self._table = table
        self._metrics = metrics
        self._restored = False
        self._saved_at = 0.0

    def revoke(self) -> None:
        """The topic's partition moved away: the next owner goes on from the table."""
        self._restored = False
        self.hub.paths.clear()
        # Its open findings too: the next owner holds (and exports) them; taken back from
        # the table, never kept beside it, if the partition comes back here.
        self.hub.correlator.book.drop(lambda _key: True)

    def open_findings(self) -> list[OpenFinding]:
        """The correlator's open findings while its partition is held here."""
        return self.hub.correlator.book.open_findings() if self._restored else []

    def on_report(self, value: bytes) -> list[Diagnosis]:
        """A worker's changed slow paths and its clock: update, correlate, save on change."""
        if not self._restored:
            self._restore()
        try:
            report = orjson.loads(value)
            for job, rows in report["paths"].items():
                self.hub.update(job, [path_of(job, row) for row in rows])
            found = self.hub.advance(int(report["now_ns"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            log.warning("ignored a malformed fabric-paths report: %s", error)
            return []
        if found or time.monotonic() - self._saved_at >= 1.0:
            write_snapshot(self._table, FABRIC_STATE_KEY, self.hub.state())
            self._saved_at = time.monotonic()
        self._metrics.record_diagnoses(found)
        return found

    def _restore(self) -> None:
        self._restored = True
        try:
            state = read_snapshot(self._table, FABRIC_STATE_KEY)
            if state is not None:
                self.hub.restore(state)
        except (SnapshotError, KeyError, TypeError, ValueError) as error:
            log.warning("fabric correlator state unreadable, relearning: %s", error)


async def _measure_progress(
    app: faust.App,
    lag: InputLag,
    kind_of_topic: Mapping[str, str],
    facts: TableFacts,
    partitions: int,
) -> set[int] | None:
    """Which input partitions hold records not processed yet (see `InputLag`).

    This worker's own partitions, and the job topic's others: their placements reach this
    worker through the shared facts, complete up to the offset their owner wrote there. The
    job topic's partitions found behind elsewhere; None before an assignment.
    """
    measured = own_progress(app.consumer, lag, kind_of_topic, facts)
    if measured is None:
        return None  # not assigned yet (or nothing to read): unknown, not caught up
    behind, collective_parts = measured
    elsewhere: set[int] = set()
    job_topic = next((topic for topic, kind in kind_of_topic.items() if kind == "job"), None)
    if job_topic is not None:
        mine = {tp.partition for tp in app.consumer.assignment() if tp.topic == job_topic}
        others = [faust.types.TP(job_topic, p) for p in range(partitions) if p not in mine]
        elsewhere = await _placements_behind(app.consumer, facts, others)
        behind["job"] |= elsewhere
    lag.update(behind, collective_parts)
    return elsewhere


def own_progress(
    consumer: Any, lag: InputLag, kind_of_topic: Mapping[str, str], facts: TableFacts
) -> tuple[dict[str, set[int]], set[int]] | None:
    """This worker's own input partitions that hold records not processed yet, by input
    kind (the high watermarks as its last fetches said: nothing asked of the broker), and
    the collective topic's partitions it reads; None before an assignment."""
    assigned = [tp for tp in consumer.assignment() if tp.topic in kind_of_topic]
    if not assigned:
        return None
    committed = getattr(consumer, "_committed_offset", {})
    behind: dict[str, set[int]] = {kind: set() for kind in kind_of_topic.values()}
    for tp in assigned:
        try:
            highwater = consumer.highwater(tp)
        except Exception as error:  # noqa: BLE001 - unknown counts as behind
            log.debug("no high watermark for %s: %s", tp, error)
            highwater = None
        kind = kind_of_topic[tp.topic]
        done = max(lag.processed.get(tp, 0), committed.get(tp) or 0)
        if kind == "job":
            facts.learn_placed_through(tp.partition, done)
        if highwater is None or done < highwater:
            behind[kind].add(tp.partition)
    collective_topic = next((t for t, kind in kind_of_topic.items() if kind == "collective"), None)
    return behind, {tp.partition for tp in assigned if tp.topic == collective_topic}


async def _placements_behind(consumer: Any, facts: TableFacts, others: list[Any]) -> set[int]:
    """The job topic's partitions owned elsewhere whose placements the facts lack yet."""
    if not others:
        return set()
    try:
        highwaters = await asyncio.wait_for(consumer.highwaters(*others), HIGHWATERS_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - a broker away: unknown counts as behind
        log.debug("no high watermarks for the job topic: %s", error)
        highwaters = {}
    return {
        tp.partition
        for tp in others
        if highwaters.get(tp) is None or facts.placed_through(tp.partition) < highwaters[tp]
    }


async def _record_lag(app: faust.App, metrics: StreamMetrics) -> None:
    """Consumer lag per topic: the high watermark minus this worker's position."""
    consumer = app.consumer
    lag: dict[str, int] = {}
    for tp in consumer.assignment():
        try:
            position = await consumer.position(tp)
            highwater = consumer.highwater(tp)
        except Exception as error:  # noqa: BLE001 - a metric must never stop the timer
            log.debug("no lag for %s: %s", tp, error)
            continue
        if position is not None and highwater is not None:
            lag[tp.topic] = lag.get(tp.topic, 0) + max(0, highwater - position)
    metrics.set_lag(lag, {tp.topic for tp in consumer.assignment()})

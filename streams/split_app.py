"""One job's detection spread over workers on Kafka (issue 34): the three agents and two
internal topics a detection worker runs with ``--split``.

- The collective topic's agent forwards each record, undecoded, to
  ``<app>-node-reports`` keyed by its job and node, with barrier marks into every partition
  of it (`streams.core.relay.Forwarder`); a record's offset in the job's partition goes with
  it (the ``c4-at`` header), so the job stage meets the groups in one order however the
  reports were spread.
- The ``<app>-node-reports`` agent is the node stages, one per partition
  (`streams.core.relay.NodeSide`): it decodes, dead-letters and takes the reports; at a
  barrier mark it sends the job's share to ``<app>-job-shares`` (keyed by job, so it reaches
  the worker holding the job's state) and writes the job's node-stage snapshot and the
  partition's resume offset to the ``node-stage`` table. A worker that takes a partition
  over (a restart, a rebalance) restores every job's snapshot of it and reads the partition
  again from its resume offset, with a reader of its own, up to where its consumer starts:
  the reports no snapshot held are taken again, those one held are skipped, so nothing is
  lost or counted twice.
- The ``<app>-job-shares`` agent is the job stage's gate (`streams.core.relay.JobSide`):
  a barrier once every node-stage partition passed it, to the engine through the live
  runtime (`streams.live.LiveDetection.on_barrier`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import aiokafka
import faust
import orjson
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth, server_list
from faust.types import TP, TableT

from schemas.codec import RejectCode, Rejection
from schemas.messages import Diagnosis, Job, Member
from streams.core.engine import Engine
from streams.core.relay import Forwarder, JobSide, NodeSide, job_of_key
from streams.core.share_wire import (
    FORGET,
    MARK_HEADER,
    RUN,
    Mark,
    WireError,
    decode_mark,
    decode_share,
    encode_share,
)
from streams.core.snapshot import SnapshotError, is_part_key, read_snapshot, write_snapshot
from streams.core.stage import JOB, StateKey
from streams.intake import key_text, send_dead_letter
from streams.live import LiveDetection
from streams.metrics import StreamMetrics

log = logging.getLogger(__name__)

POSITION_HEADER = "c4-at"  # a forwarded report's offset in its job's collective partition
# A barrier's share of a large job carries each report's operations: more than Kafka's
# default 1 MiB a record, compressed, at thousands of ranks.
MAX_SHARE_BYTES = 64 * 1024 * 1024
RESUME = b"#resume"
# Wall seconds without a report of a job before the forwarder marks a barrier on its own:
# longer than the gaps between a live job's reports are, shorter than a hang's threshold.
SILENT_AFTER_S = 0.5
# Wall seconds between two snapshots of a job's node stage in a partition: a barrier
# comes every tick, and a snapshot at each cost more than the stage's own work on a large
# job. A restarted worker reads again what came after the latest one.
SNAPSHOT_EVERY_S = 1.0
# Waits between tries to read again what a taken-over partition's snapshots do not hold.
GAP_RETRY_S = 0.5
GAP_RETRY_MAX_S = 10.0


def internal_topics(app_id: str) -> dict[str, dict[str, str]]:
    """The split's internal topics by name, with their configs. Created before the workers
    start (`c4.streams_wiring`): two workers starting together each declared them as they
    subscribed, and one group came up with ``job-shares`` left out of its subscription
    (aiokafka "Ignoring missing topic"), its shares never read."""
    return {
        f"{app_id}-node-reports": {},
        f"{app_id}-job-shares": {"max.message.bytes": str(MAX_SHARE_BYTES)},
    }


def stage_key(partition: int, job: str) -> bytes:
    """The ``node-stage`` table's key of a job's snapshot in one partition's node stage."""
    return b"@%d:" % partition + job.encode()


def resume_key(partition: int) -> bytes:
    """The ``node-stage`` table's key of a partition's resume offset."""
    return b"@%d" % partition + RESUME


def partition_of_stage_key(key: bytes) -> int | None:
    """The partition a ``node-stage`` key names (None: not such a key)."""
    if not key.startswith(b"@"):
        return None
    digits = key[1:].split(b":", 1)[0].split(b"#", 1)[0]
    return int(digits) if digits.isdigit() else None


class NodeStageTable(faust.Table):  # type: ignore[type-arg]
    """A table whose keys name their partition: the node-reports partition they are of."""

    def partition_for_key(self, key: Any) -> int:
        partition = partition_of_stage_key(bytes(key))
        return 0 if partition is None else partition


Publish = Callable[[list[Diagnosis]], Awaitable[None]]


class SplitStages:
    """The forwarder, node stages and job stage of one worker (see the module's text)."""

    def __init__(
        self,
        app: faust.App,
        *,
        app_id: str,
        partitions: int,
        tick_ns: int,
        collective_topic: str,
        deadletter_topic: str,
        live: LiveDetection,
        engine: Engine,
        publish: Publish,
        metrics: StreamMetrics,
        place: Callable[[bytes], int],
        forwarded: Callable[[Any, int, int], None] = lambda _tp, _offset, _ns: None,
    ) -> None:
        self.app = app
        self.partitions = partitions
        self.collective_topic = collective_topic
        self.live = live
        self.engine = engine
        self._adopted: set[str] = set()  # jobs whose gate learnt what their state holds
        self._publish = publish
        self.metrics = metrics
        self._forwarded = forwarded  # (topic partition, offset, event time) of each record
        # ``place``: a key's partition as the producer picks it (the forwarder names
        # each report's, so that it knows where a job's reports went)
        self.forwarder = Forwarder(tick_ns, partitions, place, self._recall_holders)
        self.nodes = NodeSide()
        self.job_side = JobSide(partitions)
        raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
        (reports, reports_config), (shares, shares_config) = internal_topics(app_id).items()
        self.node_reports = app.topic(
            reports, partitions=partitions, internal=True, config=reports_config, **raw
        )
        self.job_shares = app.topic(
            shares, partitions=partitions, internal=True, config=shares_config, **raw
        )
        self._deadletters = app.topic(deadletter_topic, partitions=partitions, **raw)
        self.table: TableT[bytes, bytes] = app.tables.add(  # type: ignore[assignment]
            NodeStageTable(
                app,
                name="node-stage",
                beacon=app.tables.beacon,
                partitions=partitions,
                key_type=bytes,
                value_type=bytes,
            )
        )
        # job -> the node-reports partitions its reports went to (`Forwarder`): keyed and
        # placed as the collective topic, so it is read where the job's records are.
        self.holders: TableT[bytes, bytes] = app.Table(
            "forward-holders", partitions=partitions, key_type=bytes, value_type=bytes
        )
        # node-reports partitions taken over here (their jobs restored)
        self._ready: set[int] = set()
        # (partition, job) -> when (monotonic) its node stage's snapshot was kept last
        self._saved_at: dict[tuple[int, str], float] = {}
        app.agent(self.node_reports, name=f"{app_id}.node-stage")(self.node_stage)
        app.agent(self.job_shares, name=f"{app_id}.job-stage")(self.job_stage)

    async def forward(self, stream: Any) -> None:
        """The collective topic's agent: every record on to the node stages."""
        async for event in stream.events():
            value = event.value
            raw = bytes(value) if isinstance(value, bytes | bytearray) else str(value).encode()
            key = key_text(event.key) or ""
            at = str(event.message.offset).encode()
            outgoing = self.forwarder.forward(raw, key, time.monotonic())
            self._keep_holders()
            # The record counts as read for the input's progress (`streams.live.InputLag`):
            # the job stage's conclusions wait on the collective partitions that lag.
            self._forwarded(event.message.tp, event.message.offset, self.forwarder.event_ns)
            for out in outgoing:
                headers = {MARK_HEADER: b"1"} if out.mark else {POSITION_HEADER: at}
                await self.node_reports.send(
                    key=out.key, value=out.value, partition=out.partition, headers=headers
                )

    def _keep_holders(self) -> None:
        """Grown holders into their table. A commit flushes the producer first, table
        writes included, so a forwarder restarted from its last commit recalls every
        partition a committed report went to, and reads the others again."""
        for job, holders in self.forwarder.grown:
            self.holders[job.encode()] = orjson.dumps(holders)
        self.forwarder.grown.clear()

    def _recall_holders(self, job: str) -> list[int]:
        """A job's holders as the table keeps them (none: not kept, or unreadable)."""
        raw = self.holders.get(job.encode())
        if not raw:
            return []
        try:
            kept = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("forwarder: the holders of %s are unreadable: %r", job, raw[:80])
            return []
        if not isinstance(kept, list):
            return []
        return [each for each in kept if type(each) is int]

    async def on_facts(self, messages: Iterable[Any]) -> None:
        """Facts of the job topic the node stages must know: a run that starts (its member
        reports), a job that stopped."""
        for message in messages:
            if isinstance(message, Member):
                await self._mark_all(Mark(RUN, message.job, message.restart))
            elif isinstance(message, Job) and message.state == "stopped":
                self.forwarder.forget(message.job)
                if self.holders.get(message.job.encode()) is not None:
                    del self.holders[message.job.encode()]
                for key in [key for key in self._saved_at if key[1] == message.job]:
                    del self._saved_at[key]
                await self._mark_all(Mark(FORGET, message.job))

    async def on_timer(self) -> None:
        """The worker's timer: a barrier for each job whose reports went silent, so that
        what the node stages took of them reaches the job stage without a next report."""
        for out in self.forwarder.silent(time.monotonic(), SILENT_AFTER_S):
            await self.node_reports.send(
                key=out.key, value=out.value, partition=out.partition, headers={MARK_HEADER: b"1"}
            )

    async def _mark_all(self, mark: Mark) -> None:
        for out in self.forwarder.to_all(mark):
            await self.node_reports.send(
                key=out.key, value=out.value, partition=out.partition, headers={MARK_HEADER: b"1"}
            )

    async def node_stage(self, stream: Any) -> None:
        """The ``node-reports`` agent: the node stages of this worker's partitions."""
        async for event in stream.events():
            message = event.message
            partition, offset = message.partition, message.offset
            if partition not in self._ready:
                self._ready.add(partition)
                resume = self._take_over(partition)
                if resume is not None and offset > resume:
                    # What no snapshot holds comes again, from the resume offset up to
                    # this record, before it.
                    for gap in await self._read_gap(message.tp, resume, offset):
                        await self._take(partition, gap.offset, gap.key, gap.value, gap.headers)
            await self._take(partition, offset, event.key, event.value, message.headers)

    async def _take(self, partition: int, offset: int, key: Any, value: Any, headers: Any) -> None:
        """One record of a node-reports partition: a mark or a forwarded report."""
        named = dict(headers or ())
        raw = bytes(value) if isinstance(value, bytes | bytearray) else str(value).encode()
        try:
            if MARK_HEADER in named:
                await self._on_mark(partition, offset, raw)
            else:
                await self._on_report(partition, offset, key, raw, named)
        except Exception:  # noqa: BLE001 - one bad record must not stop the stage
            log.exception("node stage %d failed on the record at %d", partition, offset)

    async def _read_gap(self, tp: TP, start: int, end: int) -> list[Any]:
        """The records of ``tp`` from ``start`` up to ``end`` (excluded), read by a reader
        of its own: Faust's consumer drops what is below the offset it handed on last, and
        a seek back races its fetcher (the records it fetched already keep coming and move
        that offset on again). A broker that does not answer is waited for."""
        part = aiokafka.TopicPartition(tp.topic, tp.partition)
        records: list[Any] = []
        delay = GAP_RETRY_S
        while True:
            at = records[-1].offset + 1 if records else start
            reader = self._gap_reader()
            try:
                await reader.start()
                reader.assign([part])
                reader.seek(part, at)
                while await reader.position(part) < end:
                    fetched = await reader.getmany(part, timeout_ms=1000)
                    records.extend(r for r in fetched.get(part, ()) if at <= r.offset < end)
                break
            except aiokafka.errors.KafkaError as error:
                log.warning("node stage %d: reading %d..%d: %s", tp.partition, at, end, error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, GAP_RETRY_MAX_S)
            finally:
                await reader.stop()
        log.info("node stage %d: read %d..%d again", tp.partition, start, end)
        return records

    def _gap_reader(self) -> aiokafka.AIOKafkaConsumer:
        """A reader outside the group, on the worker's broker with its credentials."""
        conf, transport = self.app.conf, cast(Any, self.app.transport)
        return aiokafka.AIOKafkaConsumer(
            bootstrap_servers=server_list(transport.url, transport.default_port),
            client_id=f"{conf.broker_client_id}-gap",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a resume offset past retention: what is left
            request_timeout_ms=int(conf.broker_request_timeout * 1000.0),
            **credentials_to_aiokafka_auth(conf.broker_credentials, conf.ssl_context),
        )

    async def _on_report(
        self, partition: int, offset: int, key: Any, raw: bytes, headers: dict[str, Any]
    ) -> None:
        job = job_of_key(bytes(key or b""))
        position_text = headers.get(POSITION_HEADER, b"")
        position = bytes(position_text).decode() if position_text else ""
        if job is None or not position.isdigit():
            log.warning("node stage %d: a record at %d not forwarded by c4", partition, offset)
            return
        for rejected in self.nodes.on_report(partition, offset, raw, job, int(position)):
            self.metrics.rejected.labels(self.collective_topic, rejected.rejection.code.value).inc()
            await send_dead_letter(
                self._deadletters,
                self.collective_topic,
                job,
                rejected.payload,
                rejected.rejection,
            )

    async def _on_mark(self, partition: int, offset: int, raw: bytes) -> None:
        try:
            mark = decode_mark(raw)
        except WireError as error:
            log.warning("node stage %d: %s", partition, error)
            return
        record = self.nodes.on_mark(partition, offset, mark)
        if record is None:
            return
        job = record.job
        await self.job_shares.send(key=job.encode(), value=encode_share(record))
        now = time.monotonic()
        if now - self._saved_at.get((partition, job), -SNAPSHOT_EVERY_S) < SNAPSHOT_EVERY_S:
            return
        self._saved_at[(partition, job)] = now
        write_snapshot(self.table, stage_key(partition, job), self.nodes.snapshot(partition, job))
        self.nodes.saved(partition, job)
        resume = self.nodes.resume_offset(partition, offset + 1)
        self.table[resume_key(partition)] = orjson.dumps(resume)

    def _take_over(self, partition: int) -> int | None:
        """Restore the jobs a partition's table holds; its resume offset (None: none)."""
        resume: int | None = None
        for key in list(self.table.keys()):
            if is_part_key(key) or partition_of_stage_key(key) != partition:
                continue
            try:
                if key.endswith(RESUME):
                    resume = int(orjson.loads(self.table[key]))
                    continue
                job = key.split(b":", 1)[1].decode()
                state = read_snapshot(self.table, key)
                if state is not None:
                    self.nodes.restore(partition, job, state)
            except (SnapshotError, KeyError, TypeError, ValueError) as error:
                log.warning("node stage %d: snapshot %r unreadable: %s", partition, key, error)
        if resume is not None:
            log.info("node stage %d taken over: reading again from %d", partition, resume)
        return resume

    async def job_stage(self, stream: Any) -> None:
        """The ``job-shares`` agent: barriers let through to the job stage."""
        async for event in stream.events():
            value = event.value
            raw = bytes(value) if isinstance(value, bytes | bytearray) else str(value).encode()
            try:
                record = decode_share(raw)
                self._adopt(record.job)
                barriers = self.job_side.offer(record)
            except WireError as error:
                log.warning("job stage: %s", error)
                failure = Rejection(RejectCode.PROCESSING_FAILED, "", str(error))
                await send_dead_letter(
                    self._deadletters, str(self.job_shares.get_topic_name()), None, raw, failure
                )
                continue
            for barrier in barriers:
                try:
                    found = self.live.on_barrier(
                        barrier.job, list(barrier.shares), barrier.latest_ns
                    )
                    self.engine.applied_barrier(barrier.job, barrier.number)
                except Exception:  # noqa: BLE001 - one barrier must not stop the stage
                    log.exception(
                        "job stage failed on barrier %d of %s", barrier.number, barrier.job
                    )
                    continue
                if found:
                    await self._publish(found)

    def _adopt(self, job: str) -> None:
        """A share of a job this worker just got: its state restored first, and the gate
        told which barrier that state holds (its shares come again: dropped)."""
        if job in self._adopted:
            return
        self._adopted.add(job)
        self.live.adopt(StateKey(JOB, job))
        applied = self.engine.applied_barrier(job)
        if applied is not None:
            self.job_side.gate.restore(job, applied)

    def revoked(self, revoked: Iterable[TP], partition_of: Callable[[str], int]) -> None:
        """Partitions went to another worker: their node stages and gated jobs with them."""
        reports = self.node_reports.get_topic_name()
        shares = self.job_shares.get_topic_name()
        gone = {tp.partition for tp in revoked if tp.topic == self.collective_topic}
        if gone:
            self.forwarder.drop(j for j in self.forwarder.jobs() if partition_of(j) in gone)
        for tp in revoked:
            if tp.topic == reports:
                self.nodes.revoke(tp.partition)
                self._ready.discard(tp.partition)
                for key in [key for key in self._saved_at if key[0] == tp.partition]:
                    del self._saved_at[key]
            elif tp.topic == shares:
                for job in self.job_side.gate.jobs():
                    if partition_of(job) == tp.partition:
                        self.job_side.gate.forget(job)
                        self._adopted.discard(job)

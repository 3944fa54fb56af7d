"""``c4 actions worker``: consume diagnoses and job placements, act, record, then commit.

Per record: decode (bad input -> dead letter, the worker goes on); a job placement is
recorded in Redis; a diagnosis goes through the pipeline, its action records are published
and delivered, the claim is marked done, and only then is the offset committed. A Redis or
Kafka outage does not lose or skip a record: the worker backs off and handles the same
record again (the claim resumes what was done), never committing past it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass

from confluent_kafka import Message

from actions.config import WorkerConfig
from actions.drivers.alertmanager.client import AlertmanagerClient
from actions.drivers.alertmanager.executor import AlertExecutor
from actions.drivers.kubernetes.client import Kube
from actions.drivers.kubernetes.executors import KubeIsolateExecutor, KubeRestartExecutor
from actions.drivers.reroute.executor import RerouteExecutor
from actions.drivers.reroute.plan_store import PlanStore
from actions.drivers.slurm.cli import CommandRunner, Slurm, SlurmError
from actions.drivers.slurm.executors import SlurmIsolateExecutor, SlurmRestartExecutor, SpareMirror
from actions.drivers.state.executors import IsolateExecutor, RestartExecutor
from actions.launcher import JobLauncher
from actions.metrics import ActionMetrics
from actions.pipeline.executor import DeadLetterSink, Executor
from actions.pipeline.pipeline import Busy, Pipeline
from actions.state import StateError, StateUnavailable
from actions.state.protocols import JobRecorder
from actions.state.store import RedisState
from actions.transport import KafkaTransport, TransportUnavailable
from schemas.codec import Rejection, dead_letter, decode
from schemas.messages import Deadletter, Diagnosis, Job
from schemas.topics import DIAGNOSIS, JOB, TopicNames

log = logging.getLogger("c4.actions")

# Test-only: the name of an executor checkpoint at which the worker kills itself (SIGKILL),
# e.g. ``restart_allocated`` (spares taken, placement not yet published). Never set it in
# production; the crash-recovery test uses it to stop the worker at the worst moment.
CRASH_ENV = "C4_ACTIONS_TEST_CRASH_AT"
MAX_BACKOFF_S = 5.0

# The partitions of the diagnosis topic this worker owns now, asked when a chore needs them.
OwnedPartitions = Callable[[], Set[int]]
# What the worker does between records, told which partitions it owns.
Housekeeping = Callable[[OwnedPartitions], None]


def crash_checkpoint(name: str) -> None:
    """Kill this process at the checkpoint named by ``C4_ACTIONS_TEST_CRASH_AT`` (test only)."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def worker_id() -> str:
    """A unique owner id for claims: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class Topics:
    """The (prefixed) topics the worker reads."""

    diagnosis: str
    job: str

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        """The v1 topic names under a prefix."""
        names = TopicNames(prefix)
        return cls(names.of(DIAGNOSIS), names.of(JOB))


# The actions this worker can take (contract v1 action names).
EXECUTORS: tuple[type[Executor], ...] = (
    IsolateExecutor,
    RestartExecutor,
    AlertExecutor,
    RerouteExecutor,
)


def build_executors(
    state: RedisState,
    config: WorkerConfig,
    transport: KafkaTransport,
    metrics: ActionMetrics,
    checkpoint: Callable[[str], None] = crash_checkpoint,
) -> dict[str, Executor]:
    """The executor mapping: action name -> executor. Add an entry to add an action."""

    def publish_job(job: Job) -> None:
        transport.publish(job)
        transport.flush()

    def letters_of(source: str) -> DeadLetterSink:
        """Publish a step's dead letter and count it under its source."""

        def publish(letter: Deadletter, key: str) -> None:
            transport.publish(letter, key=key)
            transport.flush()
            metrics.deadletters.labels(source).inc()

        return publish

    publish_dead_letter = letters_of("webhook")
    publish_scheduler_letter = letters_of("slurm")
    publish_kube_letter = letters_of("kubernetes")

    def plan_saved(max_util: float, links: Mapping[str, float], routes: int) -> None:
        metrics.record_plan(max_util, links)
        metrics.routes.inc(routes)

    # The plan in force lives under the cluster state's prefix, beside what it is made from.
    plans = PlanStore(state.client, f"{state.keys.prefix}:plan:")
    launcher = JobLauncher(config.launcher)
    scheduler = config.scheduler
    if scheduler.kind == "kubernetes":
        from actions.drivers.kubernetes.official_api import (
            ClientApi,  # the Kubernetes client, only when driven
        )

        kube = Kube(ClientApi(scheduler.kubeconfig, scheduler.command_timeout_s), scheduler)
        isolate: Executor = KubeIsolateExecutor(
            state.components, config, kube, publish_kube_letter, checkpoint, state.jobs
        )
        restart: Executor = KubeRestartExecutor(
            state.jobs, state.jobs, config, kube, publish_kube_letter, checkpoint
        )
    elif scheduler.kind == "slurm":
        slurm = Slurm(CommandRunner(scheduler.slurm_conf, scheduler.command_timeout_s))
        isolate = SlurmIsolateExecutor(
            state.components, config, slurm, publish_scheduler_letter, checkpoint
        )
        restart = SlurmRestartExecutor(config, slurm, publish_scheduler_letter, checkpoint)
    else:
        isolate = IsolateExecutor(state.components, config)
        restart = RestartExecutor(
            state.jobs, state.claims, config, publish_job, launcher, checkpoint
        )
    executors: list[Executor] = [
        isolate,
        restart,
        AlertExecutor(
            config,
            publish_dead_letter,
            alertmanagers=AlertmanagerClient(config.receivers, state.alerts, config.external_url),
            alertmanager_letter=letters_of("alertmanager"),
        ),
        RerouteExecutor(
            state.components,
            state.jobs,
            state.claims,
            plans,
            transport.outbox,
            config.reroute,
            plan_saved,
        ),
    ]
    return {executor.name: executor for executor in executors}


def build_housekeeping(state: RedisState, config: WorkerConfig, actor: str) -> Housekeeping | None:
    """What the worker does between records: resend the firing alerts of its Alertmanager
    receivers (each once per its ``resend_s``, those of the partitions it owns: one sender
    per alert across the group); with Slurm, mirror its idle nodes as spares."""
    chores: list[Housekeeping] = []
    alertmanagers = AlertmanagerClient(config.receivers, state.alerts, config.external_url)
    if alertmanagers.receivers:

        def resend_alerts(owned: OwnedPartitions) -> None:
            try:
                alertmanagers.resend(time.monotonic(), time.time_ns(), owned)
            except StateUnavailable as error:
                log.warning("alerts not resent to Alertmanager: %s", error)

        chores.append(resend_alerts)
    scheduler = config.scheduler
    if scheduler.kind == "slurm":
        slurm = Slurm(CommandRunner(scheduler.slurm_conf, scheduler.command_timeout_s))
        mirror = SpareMirror(slurm, state.components, scheduler.mirror_spares_s, actor)

        def mirror_spares(owned: OwnedPartitions) -> None:
            del owned  # the spare pool is the cluster's, not a partition's
            now = time.monotonic()
            if not mirror.due(now):
                return
            try:
                added, taken = mirror.sync(now, time.time_ns())
            except (SlurmError, StateUnavailable, StateError) as error:
                log.warning("spare pool not mirrored from Slurm: %s", error)
                return
            if added or taken:
                log.info("spare pool from Slurm: +%s -%s", added, taken)

        chores.append(mirror_spares)
    if not chores:
        return None
    if len(chores) == 1:
        return chores[0]

    def housekeeping(owned: OwnedPartitions) -> None:
        for chore in chores:
            chore(owned)

    return housekeeping


class ActionWorker:
    """The consume -> act -> record -> commit loop."""

    def __init__(
        self,
        transport: KafkaTransport,
        jobs: JobRecorder,
        pipeline: Pipeline,
        topics: Topics,
        metrics: ActionMetrics,
        stop: threading.Event,
        housekeeping: Housekeeping | None = None,
    ) -> None:
        self._housekeeping = housekeeping
        self._transport = transport
        self._jobs = jobs
        self._pipeline = pipeline
        self._topics = topics
        self._metrics = metrics
        self._stop = stop

    def run(self) -> None:
        """Until stopped: take a record, handle it (retrying through outages), commit it."""
        while not self._stop.is_set():
            if self._housekeeping is not None:
                self._housekeeping(self._owned)
            record = self._transport.poll(0.5)
            if record is None:
                continue
            if self._handle(record):
                self._transport.commit(record)

    def _owned(self) -> frozenset[int]:
        """The diagnosis topic's partitions this worker owns now."""
        return self._transport.assigned(self._topics.diagnosis)

    def _handle(self, record: Message) -> bool:
        delay = 0.1
        while not self._stop.is_set():
            try:
                if record.topic() == self._topics.job:
                    self._job(record)
                else:
                    self._diagnosis(record)
                return True
            except Busy as error:
                # Poll with backoff (the holder may finish early), never past its lease.
                cause, wait = "busy", min(delay, max(0.05, error.until_ms / 1000 - time.time()))
                log.info("%s; waiting", error)
            except StateUnavailable as error:
                cause, wait = "redis", delay
                log.warning("%s; retrying in %.1f s", error, delay)
            except TransportUnavailable as error:
                cause, wait = "kafka", delay
                log.warning("kafka: %s; retrying in %.1f s", error, delay)
            self._metrics.retries.labels(cause).inc()
            self._stop.wait(wait)
            delay = min(delay * 2, MAX_BACKOFF_S)
        return False

    def _reject(self, record: Message, rejection: Rejection, source: str) -> None:
        payload = record.value() or b""
        letter = dead_letter(str(record.topic()), payload, rejection, time.time_ns())
        key = record.key()
        self._transport.publish(letter, key=key.decode(errors="replace") if key else "")
        self._transport.flush()
        self._metrics.deadletters.labels(source).inc()
        log.warning("dead letter (%s): %s", source, rejection.reason)

    def _job(self, record: Message) -> None:
        result = decode(record.value() or b"", "job")
        if isinstance(result, Rejection):
            self._reject(record, result, "job")
            self._metrics.jobs.labels("rejected").inc()
            return
        if not isinstance(result, Job):
            # A rank's member report: the streams worker assembles placements from them and
            # publishes the job's placement on this topic, which is what is recorded here.
            self._metrics.jobs.labels("member").inc()
            return
        kept = self._jobs.record(result)
        self._metrics.jobs.labels("recorded" if kept else "older").inc()

    def _diagnosis(self, record: Message) -> None:
        result = decode(record.value() or b"", "diagnosis")
        if isinstance(result, Rejection):
            self._reject(record, result, "diagnosis")
            self._metrics.diagnoses.labels("rejected").inc()
            return
        assert isinstance(result, Diagnosis)  # noqa: S101 - decode(kind=...) returns that kind
        started = time.perf_counter()
        handled = self._pipeline.handle(result, record.partition() or 0)
        if handled.duplicate or handled.fenced:
            self._metrics.diagnoses.labels("duplicate" if handled.duplicate else "fenced").inc()
            return
        for action in handled.records:
            self._transport.publish(action)
        self._transport.flush()
        outcome = "handled" if self._pipeline.finish(handled) else "fenced"
        self._metrics.diagnoses.labels(outcome).inc()
        self._metrics.record(handled.records)
        self._metrics.processing.observe(time.perf_counter() - started)

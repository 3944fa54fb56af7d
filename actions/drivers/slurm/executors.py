"""Isolate and restart through Slurm, and the spare pool mirrored from Slurm's idle nodes.

Chosen by the worker configuration's ``scheduler: {kind: slurm}``. Isolation is first the
cluster state's transition (rate limits, epochs, the claim's fence: the Redis executor),
then the drain of the node that holds the part, so a refused transition drains nothing and
a retry after a crash drains nothing twice (`cli.Slurm` checks Slurm's own state). A
restart is Slurm's requeue of the job, once per diagnosis, kept off the failed nodes; the
job's restart count as Slurm keeps it is held against the policy's ``max_restarts``. A
command that keeps failing is a dead letter (topic ``slurm:<action>``) after its retries.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pydantic import JsonValue

from actions.config import Scheduler, WorkerConfig
from actions.drivers.scheduler_steps import (
    NodeIsolateStep,
    SchedulerStep,
    node_of,
    scheduler_failure,
)
from actions.drivers.slurm.cli import (
    MARK_PREFIX,
    Answer,
    JobInfo,
    Slurm,
    SlurmError,
    drain_reason,
)
from actions.pipeline.executor import Context, DeadLetterSink
from actions.pipeline.outcome import Reason, Result, done, failed, skipped
from actions.pipeline.policy import Step
from actions.state import StateError
from actions.state.components import ComponentStore
from actions.state.model import TransitionRequest
from actions.state.protocols import ComponentStates
from schemas.messages import Diagnosis


class _SlurmStep(SchedulerStep):
    """What both Slurm executors share: the driver, and Slurm itself."""

    driver = "slurm"

    def __init__(self, slurm: Slurm, scheduler: Scheduler, dead_letter: DeadLetterSink) -> None:
        super().__init__(scheduler, dead_letter)
        self._slurm = slurm


class SlurmIsolateExecutor(NodeIsolateStep):
    """The cluster state's isolation, then a drain of the part's node in Slurm."""

    driver = "slurm"
    taken_out = "slurm_drained"

    def __init__(
        self,
        components: ComponentStates,
        config: WorkerConfig,
        slurm: Slurm,
        dead_letter: DeadLetterSink,
        checkpoint: Callable[[str], None] = lambda name: None,
    ) -> None:
        super().__init__(components, config, dead_letter, checkpoint)
        self._slurm = slurm

    def take_out(self, node: str, step: Step, context: Context) -> str:
        diagnosis = context.diagnosis
        return self._slurm.drain(
            node, drain_reason(diagnosis.id, diagnosis.class_, step.target)
        ).value

    def earlier_run(self, node: str, context: Context) -> str | None:
        del node  # a requeue replaces the whole run, wherever it ran
        diagnosis = context.diagnosis
        if diagnosis.job is None:
            return None
        try:
            info = self._slurm.job(diagnosis.job)
        except SlurmError as error:
            if error.retryable:
                raise
            return None  # not a job Slurm knows (any more): nothing to tell the runs apart
        if not _earlier_run(diagnosis, info):
            return None
        mark = info.mark()
        by = f"by c4 for {mark[0]}" if mark is not None else "not by c4"
        return (
            f"the finding began before Slurm job {diagnosis.job}'s current run was queued "
            f"({by}): it is about an earlier run"
        )

    def preview(self, step: Step, diagnosis: Diagnosis) -> list[str]:
        node = node_of(step.kind, step.target)
        if node is None:
            return []
        reason = drain_reason(diagnosis.id, diagnosis.class_, step.target)
        return [
            shlex.join(
                ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
            )
        ]


class SlurmRestartExecutor(_SlurmStep):
    """Requeue the job once for the diagnosis; Slurm places it off the drained nodes."""

    name = "restart"

    def __init__(
        self,
        config: WorkerConfig,
        slurm: Slurm,
        dead_letter: DeadLetterSink,
        checkpoint: Callable[[str], None] = lambda name: None,
    ) -> None:
        super().__init__(slurm, config.scheduler, dead_letter)
        self._max_restarts = config.policy.max_restarts
        self._checkpoint = checkpoint

    def _excluded(self, step: Step) -> tuple[str, ...]:
        return step.nodes if self._scheduler.exclude_failed_nodes else ()

    def execute(self, step: Step, context: Context) -> Result:
        job, diagnosis = step.target, context.diagnosis.id
        try:
            info = self._slurm.job(job)
            mark = info.mark()
            ours = mark is not None and mark[0] == diagnosis
            if _earlier_run(context.diagnosis, info):
                # A finding about a run that was requeued already (its last reports arrive
                # after the requeue): requeuing the new run would stop a healthy job.
                message = (
                    f"the finding began before Slurm job {job}'s current run was queued: "
                    "it is about an earlier run"
                )
                return skipped(Reason.EARLIER_RUN, message, restarts=info.restarts)
            if not ours and info.restarts >= self._max_restarts:
                message = (
                    f"{job} was requeued {info.restarts} times, the limit is "
                    f"{self._max_restarts}: giving up"
                )
                return failed(Reason.RESTART_LIMIT, message, restarts=info.restarts)
            answer = self._slurm.requeue(
                job, diagnosis, self._excluded(step), lambda: self._checkpoint("slurm_requeued")
            )
        except SlurmError as error:
            return scheduler_failure(error, job=job)
        if answer is Answer.ENDED:
            return skipped(Reason.JOB_ENDED, f"Slurm job {job} is over: nothing to requeue")
        excluded: list[JsonValue] = list(self._excluded(step))
        return done(job=job, slurm=answer.value, excluded=excluded)

    def preview(self, step: Step, diagnosis: Diagnosis) -> list[str]:
        job = step.target
        commands = [
            [
                "scontrol",
                "update",
                f"JobId={job}",
                f"AdminComment={MARK_PREFIX}{diagnosis.id}@<restarts>",
            ],
            ["scontrol", "requeue", job],
        ]
        if self._excluded(step):
            nodes = ",".join(self._excluded(step))
            commands.append(["scontrol", "update", f"JobId={job}", f"ExcNodeList={nodes}"])
        commands.append(["scontrol", "update", f"JobId={job}", "StartTime=now"])
        return [shlex.join(command) for command in commands]


def _earlier_run(diagnosis: Diagnosis, info: JobInfo) -> bool:
    """Whether the finding began before the job's current run was queued, a run that this
    finding's own requeue did not start (a retry after that requeue is still its business)."""
    mark = info.mark()
    if mark is not None and mark[0] == diagnosis.id:
        return False
    queued = info.submitted_s
    return queued is not None and diagnosis.onset_ns < queued * 1_000_000_000


class SpareMirror:
    """The cluster state's spare pool kept to what Slurm reports idle, every ``every_s``.

    Idle in Slurm and healthy here: a spare. A spare here that Slurm no longer reports idle
    (a job took it, a person drained it): healthy again, so that restarts do not count on
    it. Nodes unknown to the topology are left out; every change is audited as usual.
    """

    def __init__(
        self, slurm: Slurm, components: ComponentStore, every_s: float, actor: str
    ) -> None:
        self._slurm = slurm
        self._components = components
        self._every_s = every_s
        self._actor = actor
        self._next = 0.0

    def due(self, now_s: float) -> bool:
        """Whether a sync is due at monotonic ``now_s``."""
        return now_s >= self._next

    def sync(self, now_s: float, now_ns: int) -> tuple[list[str], list[str]]:
        """One sync: the nodes added to the pool and those taken out of it."""
        self._next = now_s + self._every_s
        idle = set(self._slurm.idle_nodes())
        pool = set(self._components.spares())
        added, taken = [], []
        now_ms = now_ns // 1_000_000
        for node in sorted(idle - pool):
            current = self._components.component("node", node)
            if current is None or current.state != "healthy":
                continue
            try:
                answer = self._components.add_spare(node, now_ns, now_ms, self._actor)
            except StateError:
                continue  # it runs a job as far as the cluster state knows
            if answer.outcome == "ok":
                added.append(node)
        for node in sorted(pool - idle):
            request = TransitionRequest(
                kind="node",
                ident=node,
                to="healthy",
                action="spare",
                reason="not idle in Slurm any more",
                ts_ns=now_ns,
                now_ms=now_ms,
                actor=self._actor,
                allowed_from=("spare",),
            )
            if self._components.transition(request).outcome == "ok":
                taken.append(node)
        return added, taken

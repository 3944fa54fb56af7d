"""Isolate and restart through Kubernetes.

Chosen by the worker configuration's ``scheduler: {kind: kubernetes}``. Isolation is first
the cluster state's transition (rate limits, epochs, the claim's fence: the Redis executor),
then c4's marks on the node that holds the part (cordon, taint, condition), so a refused
transition marks nothing and a retry after a crash marks nothing twice (`client.Kube`
checks the API server's own state). A restart deletes the job's pods on the failed nodes
that are older than the finding, so their controller (JobSet, PyTorchJob, Job) places them
again off the cordoned nodes, and recreates a plain pod off them; it is counted once per
diagnosis against the policy's ``max_restarts``. A request that keeps failing is a dead
letter (topic ``kubernetes:<action>``) after its retries.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from pydantic import JsonValue

from actions.config import WorkerConfig
from actions.drivers.kubernetes.client import Kube, KubeError, label_value_ok
from actions.drivers.scheduler_steps import (
    NodeIsolateStep,
    SchedulerStep,
    node_of,
    scheduler_failure,
)
from actions.pipeline.executor import Context, DeadLetterSink
from actions.pipeline.outcome import Reason, Result, done, failed, skipped
from actions.pipeline.policy import Step
from actions.state import StateError
from actions.state.protocols import ComponentStates, Placements, RestartCounts
from schemas.messages import Diagnosis


class _KubeStep(SchedulerStep):
    """What both Kubernetes executors share: the driver, and the API."""

    driver = "kubernetes"

    def __init__(self, kube: Kube, config: WorkerConfig, dead_letter: DeadLetterSink) -> None:
        super().__init__(config.scheduler, dead_letter)
        self._kube = kube


class KubeIsolateExecutor(NodeIsolateStep):
    """The cluster state's isolation, then c4's marks on the part's node."""

    driver = "kubernetes"
    taken_out = "kube_marked"

    def __init__(
        self,
        components: ComponentStates,
        config: WorkerConfig,
        kube: Kube,
        dead_letter: DeadLetterSink,
        checkpoint: Callable[[str], None] = lambda name: None,
        placements: Placements | None = None,
    ) -> None:
        super().__init__(components, config, dead_letter, checkpoint)
        self._kube = kube
        self._placements = placements

    def take_out(self, node: str, step: Step, context: Context) -> str:
        diagnosis = context.diagnosis
        return self._kube.isolate(node, step.target, diagnosis.id, diagnosis.class_).value

    def earlier_run(self, node: str, context: Context) -> str | None:
        diagnosis = context.diagnosis
        if diagnosis.job is None or not label_value_ok(diagnosis.job):
            return None
        job = diagnosis.job
        try:
            places = (self._placements.placement(job) if self._placements else None) or {}
            named = [place.pod for place in places.values() if place.pod]
            if self._kube.job_pods(job, (node,), named):
                return None  # the job still runs there: the finding is about this run
            newer = self._kube.created_since(job, diagnosis.onset_ns)
        except KubeError as error:
            if error.retryable:
                raise
            return None
        except StateError:
            return None  # the placement cannot be read: nothing to tell the runs apart
        if not newer:
            return None  # gone from the node, not placed again since: no newer run
        return (
            f"{job} has no pod on {node} and {len(newer)} created after the finding "
            "began: it is about an earlier run"
        )

    def preview(self, step: Step, diagnosis: Diagnosis) -> list[str]:
        node = node_of(step.kind, step.target)
        if node is None:
            return []
        scheduler = self._scheduler
        taint = f"{scheduler.taint_key}={diagnosis.class_}:{scheduler.effect_for(diagnosis.class_)}"
        return [
            shlex.join(["kubectl", "cordon", node]),
            shlex.join(["kubectl", "taint", "nodes", node, taint, "--overwrite"]),
            f"# node {node}: condition {scheduler.condition_type}=False"
            f" (c4:{diagnosis.id} {diagnosis.class_} {step.target})",
        ]


class KubeRestartExecutor(_KubeStep):
    """Take the job's pods off the failed nodes, once for the diagnosis."""

    name = "restart"

    def __init__(
        self,
        restarts: RestartCounts,
        placements: Placements,
        config: WorkerConfig,
        kube: Kube,
        dead_letter: DeadLetterSink,
        checkpoint: Callable[[str], None] = lambda name: None,
    ) -> None:
        super().__init__(kube, config, dead_letter)
        self._restarts = restarts
        self._placements = placements
        self._max_restarts = config.policy.max_restarts
        self._checkpoint = checkpoint

    def execute(self, step: Step, context: Context) -> Result:
        job, diagnosis = step.target, context.diagnosis
        try:
            places = self._placements.placement(job) or {}
            named = [place.pod for place in places.values() if place.pod]
            pods = self._kube.job_pods(job, step.nodes, named)
            older, newer = self._kube.split_by_onset(pods, diagnosis.onset_ns)
            if not older:
                # None there older than the finding: the job was placed again since (there,
                # or elsewhere once c4 took the node out) or never ran there.
                newer = newer or self._kube.created_since(job, diagnosis.onset_ns)
                return self._nothing_left(job, diagnosis.id, step.nodes, newer)
            # Counted before any pod is touched, once for the diagnosis: a retry after a
            # crash finds it counted ("again") and finishes what is left.
            counted, restarts = self._restarts.count_restart(job, diagnosis.id, self._max_restarts)
            if counted == "limit":
                message = f"{job} was restarted {restarts} times, the limit is {self._max_restarts}"
                return failed(Reason.RESTART_LIMIT, message, restarts=restarts)
            restart = self._kube.restart(
                older, diagnosis.id, step.nodes, lambda: self._checkpoint("kube_deleted")
            )
        except KubeError as error:
            return scheduler_failure(error, job=job)
        except StateError as error:
            return failed(Reason.STATE_INVALID, str(error))
        return done(
            job=job,
            nodes=list(step.nodes),
            deleted=list(restart.deleted),
            recreated={old: new for old, new in restart.recreated},
            newer=list(newer),
            restarts=restarts if counted != "unknown_job" else None,
        )

    def _nothing_left(
        self, job: str, diagnosis: str, nodes: tuple[str, ...], newer: list[str]
    ) -> Result:
        """No pod of the job older than the finding on the nodes: done by an earlier try that
        crashed, a run the finding is not about, or no pod there at all."""
        detail: dict[str, JsonValue] = {"job": job, "nodes": list(nodes), "newer": list(newer)}
        try:
            if self._restarts.counted_for(job, diagnosis):
                return done(deleted=[], recreated={}, **detail)
        except StateError as error:
            return failed(Reason.STATE_INVALID, str(error))
        if newer:
            message = (
                "the job's pods were created after the finding began: it is about an earlier run"
            )
            return skipped(Reason.EARLIER_RUN, message, **detail)
        message = f"no pod of {job} on {', '.join(nodes)} to take off"
        return skipped(Reason.NO_TARGET, message, **detail)

    def preview(self, step: Step, diagnosis: Diagnosis) -> list[str]:
        del diagnosis
        scheduler = self._scheduler
        where = ["-n", scheduler.namespace] if scheduler.namespace else ["-A"]
        return [
            shlex.join(
                [
                    "kubectl",
                    "delete",
                    "pods",
                    *where,
                    "-l",
                    f"{scheduler.job_label}={step.target}",
                    f"--field-selector=spec.nodeName={node}",
                    f"--grace-period={scheduler.grace_period_s}",
                ]
            )
            for node in step.nodes
        ]

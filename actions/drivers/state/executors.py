"""The executors that act on the cluster state alone: isolate (a mark, compared against its
epoch) and restart (spares from the pool, the placement published, the launcher called).

Each changes state only through the stores' scripts (atomic, fenced by the claim, compared
against epochs), reached through the narrow Protocols of `actions.state.protocols` it needs.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson
from pydantic import JsonValue

from actions.config import WorkerConfig
from actions.launcher import JobLauncher
from actions.pipeline.executor import Context, Executor
from actions.pipeline.outcome import Reason, Result, done, failed, skipped
from actions.pipeline.policy import Step
from actions.state.model import (
    AllocationRequest,
    RateLimits,
    Transition,
    TransitionRequest,
    allocation_field,
)
from actions.state.protocols import Allocations, ClaimRecords, ComponentStates
from schemas.messages import Diagnosis, Job

JobSink = Callable[[Job], None]  # publish a job message on c4.job.v1 and wait for delivery
Checkpoint = Callable[[str], None]  # named points of an executor (a test hook can crash there)


def limits_of(config: WorkerConfig) -> RateLimits:
    """The rate limits of the policy, in the state scripts' units."""
    policy = config.policy
    window = max(policy.job_rate.window_s, policy.cluster_rate.window_s)
    return RateLimits(policy.job_rate.actions, policy.cluster_rate.actions, int(window * 1000))


def _reason_text(diagnosis: Diagnosis) -> str:
    top = diagnosis.suspects[0] if diagnosis.suspects else None
    named = f": suspect {top.id} ({top.score:.2f})" if top else ""
    return f"{diagnosis.class_}{named}"


class IsolateExecutor(Executor):
    """Mark a node, port, link or switch isolated, compared against its epoch."""

    name = "isolate"

    def __init__(self, components: ComponentStates, config: WorkerConfig) -> None:
        self._components = components
        self._limits = limits_of(config)

    def execute(self, step: Step, context: Context) -> Result:
        diagnosis = context.diagnosis
        current = self._components.component(step.kind, step.target)
        if current is None:
            return failed(
                Reason.UNKNOWN_TARGET, f"{step.kind} {step.target} is not in the topology"
            )
        if current.state == "isolated" and current.diagnosis != diagnosis.id:
            message = f"{step.target} was isolated by {current.diagnosis or 'an operator'}"
            return skipped(Reason.ALREADY_ISOLATED, message, by=current.diagnosis)
        request = TransitionRequest(
            kind=step.kind,
            ident=step.target,
            to="isolated",
            action="isolate",
            reason=_reason_text(diagnosis),
            ts_ns=context.now_ns,
            now_ms=context.now_ms,
            actor=context.actor,
            diagnosis=diagnosis.id,
            allowed_from=("healthy", "suspect", "spare"),
            expected_epoch=current.epoch,
            claim=context.claim,
            job=diagnosis.job,
            limits=self._limits,
            rate_member=f"{diagnosis.id}|isolate|{step.target}",
        )
        answer = self._components.transition(request)
        return transition_result(step, answer)


def transition_result(step: Step, answer: Transition) -> Result:
    """A transition script's answer as a step result."""
    if answer.outcome in {"ok", "same"}:
        return done(epoch=answer.epoch, kind=step.kind)
    if answer.outcome == "stale":
        message = f"{step.target} changed while deciding (epoch now {answer.epoch})"
        return failed(Reason.STALE_EPOCH, message, retryable=True)
    if answer.outcome == "fenced":
        return failed(Reason.FENCED, "another worker took this diagnosis over")
    if answer.outcome == "rate_limited":
        return skipped(
            Reason.RATE_LIMITED, f"{answer.limit} rate limit reached", limit=answer.limit
        )
    if answer.outcome == "refused" and answer.state == "isolated":
        message = f"{step.target} was isolated by {answer.diagnosis or 'an operator'}"
        return skipped(Reason.ALREADY_ISOLATED, message, by=answer.diagnosis)
    if answer.outcome == "refused":
        return failed(Reason.STALE_EPOCH, f"{step.target} is {answer.state}", retryable=True)
    return failed(Reason.UNKNOWN_TARGET, f"{step.kind} {step.target} is not in the topology")


class RestartExecutor(Executor):
    """Replace a job's failed nodes from the spare pool, publish the placement, call the launcher.

    Two phases, each recorded in the diagnosis's claim: the allocation (one script: spares
    taken, placement rewritten, record written) and then the publication and the launcher
    call, which a restarted worker resumes from the record without allocating again.
    """

    name = "restart"

    def __init__(
        self,
        jobs: Allocations,
        claims: ClaimRecords,
        config: WorkerConfig,
        publish_job: JobSink,
        launcher: JobLauncher,
        checkpoint: Checkpoint = lambda name: None,
    ) -> None:
        self._jobs = jobs
        self._claims = claims
        self._config = config
        self._limits = limits_of(config)
        self._publish_job = publish_job
        self._launcher = launcher
        self._checkpoint = checkpoint

    def execute(self, step: Step, context: Context) -> Result:
        job, diagnosis = step.target, context.diagnosis
        request = AllocationRequest(
            claim=context.claim,
            job=job,
            nodes=step.nodes,
            max_restarts=self._config.policy.max_restarts,
            ts_ns=context.now_ns,
            now_ms=context.now_ms,
            diagnosis=diagnosis.id,
            actor=context.actor,
            limits=self._limits,
            rate_member=f"{diagnosis.id}|restart|{job}",
        )
        answer = self._jobs.allocate(request)
        outcome = answer[0]
        if outcome not in {"ok", "exists"}:
            return self._refused(job, step, answer)
        if outcome == "ok":
            self._checkpoint("restart_allocated")
        record = orjson.loads(answer[1])
        replaced = {str(old): str(new) for old, new, _ in record["replaced"]}
        detail: dict[str, JsonValue] = {
            "replaced": dict(replaced),
            "tiers": {
                str(new): ("same leaf", "same plane", "any")[int(t)]
                for _, new, t in record["replaced"]
            },
            "attempt": int(record["attempt"]),
        }
        phase_field = allocation_field(job) + ":phase"
        phase = self._claims.records(context.claim).get(phase_field, "allocated")
        placement = self._jobs.message(job, int(record["ts_ns"]))
        if phase == "allocated":
            self._publish_job(placement)
            if not self._claims.record(context.claim, phase_field, "published"):
                return failed(Reason.FENCED, "another worker took this diagnosis over")
            phase = "published"
        if phase == "published" and self._launcher.configured:
            launched = self._launcher.launch(placement, diagnosis.id, replaced)
            if not launched.ok:
                reason = (
                    Reason.LAUNCHER_UNAVAILABLE if launched.retryable else Reason.LAUNCHER_REJECTED
                )
                return failed(reason, launched.error, launched.retryable, **detail)
            if not self._claims.record(context.claim, phase_field, "launched"):
                return failed(Reason.FENCED, "another worker took this diagnosis over")
        return done(**detail)

    def _refused(self, job: str, step: Step, answer: list[str]) -> Result:
        outcome = answer[0]
        if outcome == "fenced":
            return failed(Reason.FENCED, "another worker took this diagnosis over")
        if outcome == "unknown_job":
            return failed(Reason.UNKNOWN_JOB, f"no placement of {job} recorded from c4.job.v1")
        if outcome == "stopped":
            return failed(Reason.UNKNOWN_JOB, f"{job} is stopped")
        if outcome == "restart_limit":
            limit = self._config.policy.max_restarts
            message = f"{job} was restarted {answer[1]} times, the limit is {limit}: giving up"
            return failed(Reason.RESTART_LIMIT, message, restarts=int(answer[1]))
        if outcome == "not_in_job":
            message = f"{', '.join(step.nodes)} not in the placement of {job}"
            return skipped(Reason.NOT_IN_JOB, message)
        if outcome == "no_spare":
            message = (
                f"no spare node left to replace {answer[1]} in {job}"
                f" (the pool holds {answer[2]}, fewer than needed); nothing changed"
            )
            return failed(Reason.NO_SPARE, message, node=answer[1])
        which = answer[1] if len(answer) > 1 else "?"
        return skipped(Reason.RATE_LIMITED, f"{which} rate limit reached", limit=which)

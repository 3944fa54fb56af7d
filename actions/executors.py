"""The executors: one per action name, each with one small interface (`Executor.execute`).

The pipeline looks an action up by name in a mapping, so a new action (reroute) is one more
entry, not a change of the pipeline. An executor changes state only through the stores'
scripts (atomic, fenced by the claim, compared against epochs), reached through the narrow
Protocols of `actions.state.protocols` it needs, and answers with a `Result`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import orjson
from pydantic import JsonValue

from actions.alertmanager import payload
from actions.alertmanager_client import AlertmanagerClient, MemoryAlerts
from actions.alertmanager_v2 import Kept
from actions.config import Backoff, Receiver, WorkerConfig
from actions.launcher import JobLauncher
from actions.outcome import Reason, Result, StepSummary, done, failed, skipped
from actions.policy import Step
from actions.state.model import (
    AllocationRequest,
    Claim,
    RateLimits,
    Transition,
    TransitionRequest,
    allocation_field,
)
from actions.state.protocols import Allocations, ClaimRecords, ComponentStates
from actions.webhook import Answer, post_json
from schemas.messages import Deadletter, Diagnosis, Job

JobSink = Callable[[Job], None]  # publish a job message on c4.job.v1 and wait for delivery
DeadLetterSink = Callable[[Deadletter, str], None]  # publish a dead letter under a key
Checkpoint = Callable[[str], None]  # named points of an executor (a test hook can crash there)
PostFn = Callable[[str, bytes, float, bytes | None], Answer]  # one signed POST


@dataclass(frozen=True, slots=True)
class Context:
    """What an executor knows of the diagnosis it acts on (``partition``: the partition of
    the diagnosis topic it was read from; an alert kept for resending is resent by its owner)."""

    diagnosis: Diagnosis
    claim: Claim
    earlier: tuple[StepSummary, ...]
    actor: str
    now_ns: int
    partition: int = 0

    @property
    def now_ms(self) -> int:
        """Wall-clock milliseconds (rate-limit windows)."""
        return self.now_ns // 1_000_000


class Executor(abc.ABC):
    """One action: execute a step and say what came of it."""

    name: ClassVar[str]
    # Whether the action also runs when its diagnosis resolves, to undo what it did (reroute
    # gives the link back); the others act on firing diagnoses only.
    undoes: ClassVar[bool] = False

    @abc.abstractmethod
    def execute(self, step: Step, context: Context) -> Result:
        """One attempt; a failed result with ``retryable`` set is tried again with backoff."""

    def retry_for(self, step: Step) -> Backoff | None:
        """Tries and backoff for this step; None: the worker's default."""
        del step
        return None

    def give_up(self, step: Step, result: Result, context: Context) -> None:
        """Called once when a step failed for good (after its last try)."""
        del step, result, context

    def preview(self, step: Step, diagnosis: Diagnosis) -> list[str]:
        """What ``execute`` would run outside c4 (commands), for a dry run; none by default."""
        del step, diagnosis
        return []


def step_letter(topic: str, context: Context, result: Result, payload: str) -> Deadletter:
    """The dead letter of a step that failed for good: where it was going, why, what."""
    return Deadletter(
        v=1,
        kind="deadletter",
        topic=topic,
        ts_ns=context.now_ns,
        error=result.message,
        payload=payload,
    )


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


class AlertExecutor(Executor):
    """POST one alert step: the signed webhook payload to a webhook receiver, the v2 alert to
    an Alertmanager (`actions.alertmanager_client`); dead letter when it gives up."""

    name = "alert"

    def __init__(
        self,
        config: WorkerConfig,
        dead_letter: DeadLetterSink,
        post: PostFn | None = None,
        alertmanagers: AlertmanagerClient | None = None,
        alertmanager_letter: DeadLetterSink | None = None,
    ) -> None:
        self._receivers: Mapping[str, Receiver] = {r.name: r for r in config.receivers}
        self._external_url = config.external_url
        self._dead_letter = dead_letter
        self._post = post or _default_post
        self._alertmanagers = alertmanagers or AlertmanagerClient(
            config.receivers, MemoryAlerts(), config.external_url
        )
        self._alertmanager_letter = alertmanager_letter or dead_letter

    def _kept(self, receiver: Receiver, step: Step, context: Context) -> Kept:
        return self._alertmanagers.alert(
            receiver,
            context.diagnosis,
            step.target,
            context.now_ns,
            context.earlier,
            step.nodes if step.escalation else (),
            context.partition,
        )

    def body(self, step: Step, context: Context) -> bytes:
        """The request body (identical on every try)."""
        receiver = self._receivers[step.receiver or ""]
        if receiver.kind == "alertmanager":
            kept = self._kept(receiver, step, context)
            return self._alertmanagers.body(receiver, [kept], context.now_ns)
        return orjson.dumps(
            payload(
                context.diagnosis,
                receiver.name,
                step.target,
                context.earlier,
                step.nodes if step.escalation else (),
                self._external_url,
            )
        )

    def execute(self, step: Step, context: Context) -> Result:
        receiver = self._receivers.get(step.receiver or "")
        if receiver is None:
            return skipped(Reason.NO_RECEIVER, f"no receiver named {step.receiver!r}")
        detail: dict[str, JsonValue] = {"receiver": receiver.name}
        if step.escalation:
            detail["escalation"] = "blast_radius"
        if receiver.kind == "alertmanager":
            kept = self._kept(receiver, step, context)
            answer = self._alertmanagers.send(receiver, context.diagnosis, kept, context.now_ns)
        else:
            secret = receiver.secret.get_secret_value().encode() if receiver.secret else None
            body = self.body(step, context)
            answer = self._post(receiver.url, body, receiver.timeout_s, secret)
        if answer.ok:
            return done(**detail, http_status=answer.status)
        reason = Reason.RECEIVER_UNAVAILABLE if answer.retryable else Reason.RECEIVER_REJECTED
        what = "alertmanager" if receiver.kind == "alertmanager" else "receiver"
        message = f"{what} {receiver.name}: {answer.error}"
        return failed(reason, message, answer.retryable, **detail)

    def retry_for(self, step: Step) -> Backoff | None:
        receiver = self._receivers.get(step.receiver or "")
        return receiver.retry if receiver else None

    def give_up(self, step: Step, result: Result, context: Context) -> None:
        receiver = self._receivers.get(step.receiver or "")
        if receiver is None:
            return
        body = self.body(step, context).decode()
        if receiver.kind == "alertmanager":
            letter = step_letter(f"alertmanager:{receiver.name}", context, result, body)
            self._alertmanager_letter(letter, receiver.name)
            return
        letter = step_letter(f"webhook:{receiver.name}", context, result, body)
        self._dead_letter(letter, receiver.name)


def _default_post(url: str, body: bytes, timeout_s: float, secret: bytes | None) -> Answer:
    return post_json(url, body, timeout_s, secret)

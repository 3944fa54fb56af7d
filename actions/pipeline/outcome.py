"""What a step came to, and what a stage of the pipeline answers: closed sets of reasons.

Every executor answers with a `Result`: done, skipped or failed, with a `Reason` (whether a
retry may help, and what went wrong); the reasons are a closed enum so that dashboards and
alert rules can count them, ``detail`` carries the free-form particulars. Every stage of the
pipeline answers with a `StageResult` (Alertmanager's notify style: go on, or stop with a
`Stop` reason and whether a later try may help). `StepSummary` is an earlier step's result
as the later ones (the alert's annotations) see it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import JsonValue

Status = Literal["done", "skipped", "failed"]


class Reason(StrEnum):
    """Why a step was skipped or failed (``detail.reason`` of a v1 action record)."""

    # skipped: the policy or the state said not to act
    DRY_RUN = "dry_run"
    NO_POLICY = "no_policy"
    BELOW_MIN_SCORE = "below_min_score"
    BLAST_RADIUS = "blast_radius"
    RATE_LIMITED = "rate_limited"
    ALREADY_ISOLATED = "already_isolated"
    NO_JOB = "no_job"
    NOT_IN_JOB = "not_in_job"
    NO_TARGET = "no_target"
    NO_RECEIVER = "no_receiver"
    KEPT_OUT = "kept_out"  # a link, port or switch stays out of the plan until released
    EARLIER_RUN = "earlier_run"  # the finding is about a run the scheduler restarted since
    # failed: the action was attempted and did not happen
    UNKNOWN_TARGET = "unknown_target"
    UNKNOWN_JOB = "unknown_job"
    NO_SPARE = "no_spare"
    RESTART_LIMIT = "restart_limit"
    STALE_EPOCH = "stale_epoch"
    FENCED = "fenced"
    LAUNCHER_REJECTED = "launcher_rejected"
    LAUNCHER_UNAVAILABLE = "launcher_unavailable"
    RECEIVER_REJECTED = "receiver_rejected"
    RECEIVER_UNAVAILABLE = "receiver_unavailable"
    STORE_UNAVAILABLE = "store_unavailable"  # the plan store did not answer (retryable)
    PLAN_CHANGED = "plan_changed"  # another plan came into force meanwhile (retryable)
    STATE_INVALID = "state_invalid"  # Redis holds a topology, placement or plan that is not valid
    NO_ROUTE = "no_route"  # the planner could not plan the reroute
    SCHEDULER_UNAVAILABLE = "scheduler_unavailable"  # Slurm's controller did not answer
    SCHEDULER_REJECTED = "scheduler_rejected"  # Slurm refused the command
    JOB_ENDED = "job_ended"  # the scheduler's job is over: nothing to restart


@dataclass(frozen=True, slots=True)
class Result:
    """The outcome of one attempt: status, reason (None when done), retryable, particulars."""

    status: Status
    reason: Reason | None = None
    message: str = ""
    retryable: bool = False
    detail: Mapping[str, JsonValue] = field(default_factory=dict)

    @property
    def error(self) -> Reason | None:
        """The failure reason, None unless failed."""
        return self.reason if self.status == "failed" else None

    def with_detail(self, **extra: JsonValue) -> Result:
        """The same result with more particulars."""
        return Result(
            self.status, self.reason, self.message, self.retryable, {**self.detail, **extra}
        )

    def as_detail(self) -> dict[str, JsonValue]:
        """``detail`` of the v1 action record: particulars, plus reason and message."""
        out: dict[str, JsonValue] = dict(self.detail)
        if self.reason is not None:
            out["reason"] = self.reason.value
        if self.message:
            out["message"] = self.message
        return out


@dataclass(frozen=True, slots=True)
class StepSummary:
    """An earlier step of the same diagnosis, for the alert's annotations."""

    action: str
    target: str
    status: str
    reason: str | None = None
    message: str = ""

    @classmethod
    def of(cls, action: str, target: str, result: Result) -> StepSummary:
        """The summary of one step's result."""
        reason = result.reason.value if result.reason else None
        return cls(action, target, result.status, reason, result.message)

    def line(self) -> str:
        """``restart job-42: failed (no_spare: ...)``."""
        why = f" ({self.reason}: {self.message})" if self.reason else ""
        return f"{self.action} {self.target}: {self.status}{why}"


class Stop(StrEnum):
    """Why a diagnosis's stages stopped before its action records (closed set)."""

    DUPLICATE = "duplicate"  # handled before: nothing to act on or publish
    BUSY = "busy"  # another live worker holds its claim (retryable, after the lease)
    FENCED = "fenced"  # another worker took its claim over: this one writes nothing more


@dataclass(frozen=True, slots=True)
class StageResult:
    """What a stage answers: go on (``error`` None), or stop, and whether retrying may help."""

    retryable: bool = False
    error: Stop | None = None
    until_ms: int = 0  # busy: when the holder's lease runs out (wall-clock ms)


GO = StageResult()


def stop(error: Stop, retryable: bool = False, until_ms: int = 0) -> StageResult:
    """A stage's answer that ends the diagnosis's stages."""
    return StageResult(retryable, error, until_ms)


def done(**detail: JsonValue) -> Result:
    """The action happened (or had already happened for this diagnosis)."""
    return Result("done", detail=detail)


def skipped(reason: Reason, message: str, **detail: JsonValue) -> Result:
    """The action was deliberately not taken."""
    return Result("skipped", reason, message, detail=detail)


def failed(reason: Reason, message: str, retryable: bool = False, **detail: JsonValue) -> Result:
    """The action was attempted and did not happen; ``retryable`` when trying again may help."""
    return Result("failed", reason, message, retryable, detail)

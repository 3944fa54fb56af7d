"""The stages one step of a plan goes through; `actions.pipeline.pipeline` composes them.

resume -> verdict -> lease -> retry(execute) -> record, or in a dry run verdict -> dry run.
A step is decided by the first of resume (its result recorded in the claim by an earlier
try), verdict (the policy decided it), dry run and retry that has a result; the stages after
the deciding one pass it through. Each answers a `StageResult` (`actions.pipeline.stages.Stage`).

- lease: renew the claim's lease before acting; fenced when another worker took it over.
- retry: try the step while its result is a retryable failure, with exponential backoff,
  at most ``tries`` times (the executor's own backoff, or the worker's); an executor is told
  once when its step failed for good.
- execute: the executor registered under the step's action name, with what it knows of
  the diagnosis (the earlier steps' results, for the alert's annotations).
- record: write the step's result into the claim, so that a worker taking it over resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pydantic import JsonValue

from actions.config import Backoff
from actions.pipeline.executor import Context, Executor
from actions.pipeline.outcome import (
    GO,
    Reason,
    Result,
    StageResult,
    StepSummary,
    Stop,
    skipped,
    stop,
)
from actions.pipeline.policy import Step
from actions.pipeline.recording import STEP_FIELD, result_from_json, result_json
from actions.pipeline.stages import Clock, StepRun
from actions.state.protocols import ClaimRecords, Claims

Sleep = Callable[[float], None]

log = logging.getLogger("c4.actions")


def run_with_retry(attempt: Callable[[], Result], backoff: Backoff, sleep: Sleep) -> Result:
    """Try while the result is a retryable failure, at most ``tries`` times."""
    result = attempt()
    tries = 1
    while result.status == "failed" and result.retryable and tries < backoff.tries:
        sleep(backoff.delay(tries))
        result = attempt()
        tries += 1
    return result.with_detail(tries=tries) if tries > 1 else result


class ResumeStage:
    """resume: a step whose result the claim records is not taken again."""

    def run(self, item: StepRun) -> StageResult:
        prior = item.handling.recorded.get(STEP_FIELD + item.step.key)
        if prior is not None:
            item.result, item.resumed = result_from_json(prior), True
        return GO


class VerdictStage:
    """verdict: a step the policy already decided (skipped, or failed) is not executed."""

    def run(self, item: StepRun) -> StageResult:
        if item.result is None and item.step.verdict is not None:
            item.result = item.step.verdict
        return GO


class DryRunStage:
    """dry run: nothing is executed; what would run outside c4 is logged and recorded."""

    def __init__(self, executors: Mapping[str, Executor]) -> None:
        self._executors = executors

    def run(self, item: StepRun) -> StageResult:
        if item.result is None:
            executor = self._executors[item.step.action]
            commands = executor.preview(item.step, item.handling.diagnosis)
            for command in commands:
                log.info("dry run, would run: %s", command)
            detail: dict[str, JsonValue] = {"would_run": list(commands)} if commands else {}
            item.result = skipped(Reason.DRY_RUN, "dry run: not executed", **detail)
        return GO


class LeaseStage:
    """lease: renew the claim's lease before acting; fenced when it was taken over."""

    def __init__(self, claims: Claims, lease_ms: int, clock: Clock) -> None:
        self._claims = claims
        self._lease_ms = lease_ms
        self._clock = clock

    def run(self, item: StepRun) -> StageResult:
        if item.result is not None:
            return GO
        now_ms = self._clock() // 1_000_000
        if not self._claims.renew(item.handling.held, now_ms, self._lease_ms):
            return stop(Stop.FENCED)
        return GO


@dataclass(frozen=True, slots=True)
class Attempt:
    """One step's executor call with its context fixed: the same on every try."""

    executor: Executor
    step: Step
    context: Context

    def __call__(self) -> Result:
        return self.executor.execute(self.step, self.context)

    @property
    def backoff(self) -> Backoff | None:
        """The executor's tries and backoff for this step; None: the worker's default."""
        return self.executor.retry_for(self.step)

    def give_up(self, result: Result) -> None:
        """Tell the executor its step failed for good."""
        self.executor.give_up(self.step, result, self.context)


class Attempts(Protocol):
    """What the retry stage tries (`ExecuteStage`)."""

    def prepare(self, item: StepRun) -> Attempt:
        """The step's attempt, ready to try."""


class ExecuteStage:
    """execute: the executor registered under the step's action name (tried by retry)."""

    def __init__(self, executors: Mapping[str, Executor], actor: str, clock: Clock) -> None:
        self._executors = executors
        self._actor = actor
        self._clock = clock

    def prepare(self, item: StepRun) -> Attempt:
        """The executor and what it knows of the diagnosis: the earlier steps, the time."""
        handling = item.handling
        earlier = tuple(StepSummary.of(s.action, s.target, r) for s, r in handling.results)
        context = Context(
            handling.diagnosis,
            handling.held,
            earlier,
            self._actor,
            self._clock(),
            handling.partition,
        )
        return Attempt(self._executors[item.step.action], item.step, context)


class RetryStage:
    """retry: try the step while its result is a retryable failure (see `run_with_retry`)."""

    def __init__(self, attempts: Attempts, default: Backoff, sleep: Sleep) -> None:
        self._attempts = attempts
        self._default = default
        self._sleep = sleep

    def run(self, item: StepRun) -> StageResult:
        if item.result is not None:
            return GO
        attempt = self._attempts.prepare(item)
        result = run_with_retry(attempt, attempt.backoff or self._default, self._sleep)
        if result.status == "failed":
            attempt.give_up(result)
        item.result = result
        return GO


class RecordStage:
    """record: write the step's result into the claim; fenced when it was taken over."""

    def __init__(self, claims: ClaimRecords) -> None:
        self._claims = claims

    def run(self, item: StepRun) -> StageResult:
        if item.resumed:
            return GO
        value = result_json(item.decided)
        if not self._claims.record(item.handling.held, STEP_FIELD + item.step.key, value):
            return stop(Stop.FENCED)
        return GO

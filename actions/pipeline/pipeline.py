"""The actions pipeline: the stages a diagnosis goes through, composed, and what came of it.

dedup -> plan -> mark -> steps, each step resume -> verdict -> lease -> retry(execute) ->
record (`stages`, `step_stages`); a dry run is plan -> steps, each step verdict -> dry run,
and claims, marks and executes nothing. Each step's result is written into the claim as it
completes; the caller publishes the v1 action records, then `finish` marks the diagnosis
handled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from actions import ActionsError
from actions.config import WorkerConfig
from actions.pipeline.executor import Executor
from actions.pipeline.outcome import Stop
from actions.pipeline.recording import action_record
from actions.pipeline.stages import (
    Chain,
    DedupStage,
    Handling,
    MarkStage,
    PlanStage,
    StepRun,
    StepsStage,
    ViewReader,
)
from actions.pipeline.step_stages import (
    DryRunStage,
    ExecuteStage,
    LeaseStage,
    RecordStage,
    ResumeStage,
    RetryStage,
    Sleep,
    VerdictStage,
)
from actions.state.model import Claim
from actions.state.protocols import Claims, NodeLeaves, Placements, SuspectWindow, Transitions
from schemas.messages import Action, Diagnosis


class Busy(ActionsError):  # noqa: N818 - reads as what it is
    """Another live worker holds the diagnosis; try again after its lease."""

    def __init__(self, diagnosis: str, until_ms: int) -> None:
        super().__init__(f"diagnosis {diagnosis} is being handled by another worker")
        self.until_ms = until_ms


@dataclass(frozen=True, slots=True)
class Handled:
    """What came of one diagnosis: the action records to publish, and the claim to finish."""

    records: tuple[Action, ...]
    claim: Claim | None = None
    duplicate: bool = False
    fenced: bool = False


class PipelineComponents(Transitions, NodeLeaves, Protocol):
    """The component store as the stages use it: marks, and where nodes hang off."""


class PipelineState(Protocol):
    """The stores the stages use (`actions.state.store.RedisState` has them)."""

    @property
    def claims(self) -> Claims:
        """Dedup, lease and the claim's record."""

    @property
    def jobs(self) -> Placements:
        """The job's placement, for the policy's view."""

    @property
    def suspects(self) -> SuspectWindow:
        """The job's recent suspect nodes, for the blast radius."""

    @property
    def components(self) -> PipelineComponents:
        """Suspect marks; the suspect nodes' leaves, for the escalation."""


class Pipeline:
    """Runs diagnoses through the stages against one state and one executor mapping."""

    def __init__(
        self,
        state: PipelineState,
        executors: Mapping[str, Executor],
        config: WorkerConfig,
        actor: str,
        dry_run: bool = False,
        clock: Callable[[], int] = time.time_ns,
        sleep: Sleep = time.sleep,
    ) -> None:
        config.check_actions(executors)
        undoing = frozenset(name for name, e in executors.items() if e.undoes)
        view = ViewReader(
            state.jobs, state.suspects, state.components, config.policy, clock, dry_run
        )
        decide = PlanStage(view, state.claims, config, undoing)
        steps: Chain[StepRun]
        if dry_run:
            steps = Chain(VerdictStage(), DryRunStage(executors))
            self._stages: Chain[Handling] = Chain(decide, StepsStage(steps))
        else:
            lease_ms = int(config.claim_lease_s * 1000)
            steps = Chain(
                ResumeStage(),
                VerdictStage(),
                LeaseStage(state.claims, lease_ms, clock),
                RetryStage(ExecuteStage(executors, actor, clock), config.retry, sleep),
                RecordStage(state.claims),
            )
            self._stages = Chain(
                DedupStage(state.claims, actor, lease_ms, config.dedup_ttl_s, clock),
                decide,
                MarkStage(state.components, actor, clock),
                StepsStage(steps),
            )
        self._claims = state.claims
        self._ttl_s = config.dedup_ttl_s
        self._clock = clock

    def handle(self, diagnosis: Diagnosis, partition: int = 0) -> Handled:
        """Dedup, plan and execute one diagnosis read from ``partition`` of its topic;
        raises `Busy` or `StateUnavailable`."""
        handling = Handling(diagnosis, partition)
        answer = self._stages.run(handling)
        if answer.error is Stop.DUPLICATE:
            return Handled((), duplicate=True)
        if answer.error is Stop.BUSY:
            raise Busy(diagnosis.id, answer.until_ms)
        if answer.error is Stop.FENCED:
            return Handled((), handling.claim, fenced=True)
        now = self._clock()
        records = tuple(
            action_record(diagnosis, step, result, now) for step, result in handling.results
        )
        return Handled(records, handling.claim)

    def finish(self, handled: Handled) -> bool:
        """Mark the diagnosis handled, once its records are published; False when fenced."""
        if handled.claim is None or handled.duplicate or handled.fenced:
            return True
        return self._claims.finish(handled.claim, self._ttl_s)

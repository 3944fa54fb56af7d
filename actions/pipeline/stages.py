"""The stages a diagnosis goes through, each one job; `actions.pipeline.pipeline` composes them.

Alertmanager's notify pipeline, for diagnoses: a stage takes what the earlier stages found
(a `Handling`, or a `StepRun` for one step) and answers a `StageResult` of
`outcome`: go on, or stop with a `Stop` reason (duplicate, busy, fenced) and whether
a later try may help. A `Chain` runs its stages in order until one stops.

- dedup: claim the diagnosis (id and state); a handled one is a duplicate, one held by a
  live worker is busy (retryable after its lease), a claim whose lease ran out is taken over
  and its record is read back, so that its steps are resumed, not repeated.
- plan: the plan recorded in the claim, or `actions.pipeline.policy.plan` on a `View` of the state
  read for this diagnosis, recorded in the claim.
- mark: components named but not isolated become suspect; resolved, healthy again.
- steps: each step of the plan through the step stages (`actions.pipeline.step_stages`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from actions import ActionsError
from actions.config import Policy, WorkerConfig
from actions.pipeline.outcome import GO, Reason, Result, StageResult, Stop, stop
from actions.pipeline.policy import Plan, Step, View, kept_out, plan, suspect_nodes
from actions.pipeline.recording import PLAN_FIELD, plan_from_json, plan_json
from actions.state.model import Claim, TransitionRequest
from actions.state.protocols import (
    ClaimRecords,
    Claims,
    NodeLeaves,
    Placements,
    SuspectWindow,
    Transitions,
)
from schemas.messages import Diagnosis

Clock = Callable[[], int]  # wall-clock nanoseconds
T_contra = TypeVar("T_contra", contravariant=True)
T = TypeVar("T")
_MARKABLE = frozenset({"port", "link", "switch"})


class StageError(ActionsError):
    """The stages were composed wrong (a stage ran without what an earlier one provides)."""


@dataclass
class Handling:
    """One diagnosis going through the stages: what the stages found so far."""

    diagnosis: Diagnosis
    partition: int = 0  # of the diagnosis topic, where it was read
    claim: Claim | None = None  # None: a dry run (no dedup stage)
    recorded: dict[str, str] = field(default_factory=dict)  # the claim's record when claimed
    planned: Plan = field(default_factory=lambda: Plan(()))
    results: list[tuple[Step, Result]] = field(default_factory=list)

    @property
    def held(self) -> Claim:
        """The claim, for the stages that run after dedup only."""
        if self.claim is None:
            message = "a stage that needs the claim ran without the dedup stage"
            raise StageError(message)
        return self.claim


@dataclass
class StepRun:
    """One step going through the step stages: decided once ``result`` is set."""

    handling: Handling
    step: Step
    result: Result | None = None
    resumed: bool = False  # read back from the claim's record: not written again

    @property
    def decided(self) -> Result:
        """The step's result, for the stages after the deciding ones."""
        if self.result is None:
            message = f"no stage decided step {self.step.key}"
            raise StageError(message)
        return self.result


class Stage(Protocol[T_contra]):
    """One job of the pipeline."""

    def run(self, item: T_contra) -> StageResult:
        """Do the job; `GO`, or stop the chain."""


class Chain(Generic[T]):
    """Stages run in order until one stops (Alertmanager's MultiStage)."""

    def __init__(self, *stages: Stage[T]) -> None:
        self.stages = stages

    def run(self, item: T) -> StageResult:
        for stage in self.stages:
            answer = stage.run(item)
            if answer.error is not None:
                return answer
        return GO


class DedupStage:
    """dedup: claim the diagnosis; read back the record of a claim taken over."""

    def __init__(self, claims: Claims, actor: str, lease_ms: int, ttl_s: int, clock: Clock) -> None:
        self._claims = claims
        self._actor = actor
        self._lease_ms = lease_ms
        self._ttl_s = ttl_s
        self._clock = clock

    def run(self, item: Handling) -> StageResult:
        diagnosis = item.diagnosis
        status, claim, until = self._claims.claim(
            diagnosis.id,
            diagnosis.state,
            self._actor,
            self._clock() // 1_000_000,
            self._lease_ms,
            self._ttl_s,
        )
        if status == "done":
            return stop(Stop.DUPLICATE)
        if status == "busy" or claim is None:
            return stop(Stop.BUSY, retryable=True, until_ms=until)
        item.claim = claim
        item.recorded = self._claims.records(claim)
        return GO


class ViewReader:
    """What the policy reads of the state for one diagnosis; notes a firing one's suspects."""

    def __init__(
        self,
        placements: Placements,
        suspects: SuspectWindow,
        leaves: NodeLeaves,
        policy: Policy,
        clock: Clock,
        dry_run: bool,
    ) -> None:
        self._placements = placements
        self._suspects = suspects
        self._leaves = leaves
        self._policy = policy
        self._clock = clock
        self._dry_run = dry_run

    def read(self, diagnosis: Diagnosis) -> View:
        """The job's placement, its recent suspect nodes, and where they hang off."""
        job = diagnosis.job
        if job is None:
            return View()
        places = self._placements.placement(job)
        rank_nodes = {rank: place.node for rank, place in (places or {}).items()}
        job_nodes = frozenset(rank_nodes.values()) if places is not None else None
        nodes = suspect_nodes(diagnosis, self._policy.min_score, View(rank_nodes=rank_nodes))
        now_ms = self._clock() // 1_000_000
        window_ms = int(self._policy.suspect_window_s * 1000)
        if diagnosis.state == "firing" and not self._dry_run:
            self._suspects.note(job, nodes, now_ms, window_ms)
        recent = self._suspects.recent(job, now_ms, window_ms)
        leaves = self._leaves.node_leaves(sorted(set(nodes) | recent))
        return View(job_nodes, rank_nodes, recent, leaves)


class PlanStage:
    """plan: resume the plan recorded in the claim, or decide it once and record it."""

    def __init__(
        self,
        view: ViewReader,
        claims: ClaimRecords,
        config: WorkerConfig,
        undoing: frozenset[str],
    ) -> None:
        self._view = view
        self._claims = claims
        self._config = config
        self._undoing = undoing

    def run(self, item: Handling) -> StageResult:
        stored = item.recorded.get(PLAN_FIELD)
        if stored is not None:
            # Resuming: the plan was decided once; the state has since been changed by it.
            item.planned = plan_from_json(stored)
            return GO
        diagnosis = item.diagnosis
        item.planned = plan(diagnosis, self._view.read(diagnosis), self._config, self._undoing)
        if item.claim is not None and not self._claims.record(
            item.claim, PLAN_FIELD, plan_json(item.planned)
        ):
            return stop(Stop.FENCED)
        return GO


class MarkStage:
    """mark: components named but not isolated become suspect; resolved, healthy again.

    A resolved finding's link, port or switch that the reroute keeps out (`kept_out`) is
    isolated instead: out of service until an operator releases it (``c4 state release``,
    which gives it back to the plan).
    """

    def __init__(self, transitions: Transitions, actor: str, clock: Clock) -> None:
        self._transitions = transitions
        self._actor = actor
        self._clock = clock

    def run(self, item: Handling) -> StageResult:
        diagnosis, planned, claim = item.diagnosis, item.planned, item.held
        targets = list(planned.marks)
        if planned.clears:
            found = {("node", n) for n in suspect_nodes(diagnosis, 0.0, View())}
            found |= {(s.type, s.id) for s in diagnosis.suspects if s.type in _MARKABLE}
            targets = sorted(found)
        to, allowed, action = (
            ("healthy", "suspect", "clear") if planned.clears else ("suspect", "healthy", "suspect")
        )
        why = "resolved" if planned.clears else "named, not isolated"
        now = self._clock()
        rerouted = {step.target for step in planned.steps if step.action == "reroute"}
        for kind, ident in targets:
            target_to, target_action, reason = to, action, f"{diagnosis.class_}: {why}"
            if planned.clears and ident in rerouted and kept_out(diagnosis, kind):
                target_to, target_action = "isolated", "isolate"
                reason = f"{diagnosis.class_}: resolved by the reroute, kept out until released"
            self._transitions.transition(
                TransitionRequest(
                    kind=kind,
                    ident=ident,
                    to=target_to,
                    action=target_action,
                    reason=reason,
                    ts_ns=now,
                    now_ms=now // 1_000_000,
                    actor=self._actor,
                    diagnosis=diagnosis.id,
                    allowed_from=(allowed,),
                    claim=claim,
                    only_own=planned.clears,
                )
            )
        return GO


class StepsStage:
    """steps: each step of the plan through the step stages, in order.

    A conditional step (an alert sent only when an earlier step failed) is left out unless
    one did; a step that comes out fenced stops the diagnosis.
    """

    def __init__(self, steps: Stage[StepRun]) -> None:
        self._steps = steps

    def run(self, item: Handling) -> StageResult:
        for step in item.planned.steps:
            if step.conditional and not any(r.status == "failed" for _, r in item.results):
                continue
            run = StepRun(item, step)
            answer = self._steps.run(run)
            if answer.error is not None:
                return answer
            result = run.decided
            item.results.append((step, result))
            if result.reason is Reason.FENCED:
                return stop(Stop.FENCED)
        return GO

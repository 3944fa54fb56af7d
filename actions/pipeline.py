"""The stages a diagnosis goes through: dedup -> policy -> retry -> execute, then the records.

- dedup: claim the diagnosis (id and state) in Redis; a handled one is a duplicate, one held
  by a live worker is busy (the caller retries later), a claim whose lease ran out is taken
  over and its recorded steps are resumed, not repeated.
- policy: `actions.policy.plan` on a view of the state read for this diagnosis.
- retry: each step is tried with exponential backoff while its result says retryable.
- execute: the executor registered under the step's action name.
Each step's result is written into the claim as it completes; the caller publishes the v1
action records, then `finish` marks the diagnosis handled.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from actions import ActionsError
from actions.alertmanager import StepSummary
from actions.config import Backoff, WorkerConfig
from actions.executors import Context, Executor
from actions.outcome import Reason, Result, skipped
from actions.policy import Plan, Step, View, plan, suspect_nodes
from actions.reroute_executor import kept_out
from actions.state.store import Claim, RedisState
from schemas.messages import Action, Diagnosis

Sleep = Callable[[float], None]
STEP_FIELD = "step:"
PLAN_FIELD = "plan"
_MARKABLE = frozenset({"port", "link", "switch"})


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


def run_with_retry(attempt: Callable[[], Result], backoff: Backoff, sleep: Sleep) -> Result:
    """The retry stage: try while the result is a retryable failure, at most ``tries`` times."""
    result = attempt()
    tries = 1
    while result.status == "failed" and result.retryable and tries < backoff.tries:
        sleep(backoff.delay(tries))
        result = attempt()
        tries += 1
    return result.with_detail(tries=tries) if tries > 1 else result


def action_id(diagnosis: Diagnosis, step: Step) -> str:
    """A stable id per diagnosis, state and step: a record published again keeps its id."""
    text = f"{diagnosis.id}|{diagnosis.state}|{step.key}"
    return "a-" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def action_record(diagnosis: Diagnosis, step: Step, result: Result, ts_ns: int) -> Action:
    """The v1 action record of one step."""
    detail = result.as_detail()
    if step.receiver is not None:
        detail.setdefault("receiver", step.receiver)
    if step.nodes and step.action != "alert":
        detail.setdefault("nodes", list(step.nodes))
    detail["class"] = diagnosis.class_
    detail["state"] = diagnosis.state
    if diagnosis.job is not None:
        detail["job"] = diagnosis.job
    return Action.model_validate(
        {
            "v": 1,
            "kind": "action",
            "id": action_id(diagnosis, step),
            "diagnosis": diagnosis.id,
            "ts_ns": ts_ns,
            "action": step.action,
            "target": step.target,
            "status": result.status,
            "detail": detail,
        }
    )


def _result_json(result: Result) -> str:
    return orjson.dumps(
        {
            "status": result.status,
            "reason": result.reason.value if result.reason else None,
            "message": result.message,
            "detail": dict(result.detail),
        }
    ).decode()


def _result_from_json(text: str) -> Result:
    data = orjson.loads(text)
    reason = Reason(data["reason"]) if data["reason"] else None
    return Result(data["status"], reason, data["message"], False, data["detail"])


def _plan_json(planned: Plan) -> str:
    steps = [
        {
            "action": step.action,
            "target": step.target,
            "kind": step.kind,
            "nodes": list(step.nodes),
            "receiver": step.receiver,
            "escalation": step.escalation,
            "conditional": step.conditional,
            "verdict": _result_json(step.verdict) if step.verdict else None,
        }
        for step in planned.steps
    ]
    marks = [list(mark) for mark in planned.marks]
    return orjson.dumps({"steps": steps, "marks": marks, "clears": planned.clears}).decode()


def _plan_from_json(text: str) -> Plan:
    data = orjson.loads(text)
    steps = tuple(
        Step(
            item["action"],
            item["target"],
            item["kind"],
            tuple(item["nodes"]),
            item["receiver"],
            item["escalation"],
            item["conditional"],
            _result_from_json(item["verdict"]) if item["verdict"] else None,
        )
        for item in data["steps"]
    )
    marks = tuple((kind, ident) for kind, ident in data["marks"])
    return Plan(steps, marks, data["clears"])


class Pipeline:
    """Runs diagnoses through the stages against one state and one executor mapping."""

    def __init__(
        self,
        state: RedisState,
        executors: Mapping[str, Executor],
        config: WorkerConfig,
        actor: str,
        dry_run: bool = False,
        clock: Callable[[], int] = time.time_ns,
        sleep: Sleep = time.sleep,
    ) -> None:
        config.check_actions(executors)
        self._state = state
        self._executors = executors
        self._config = config
        self._actor = actor
        self._dry_run = dry_run
        self._undoing = frozenset(name for name, e in executors.items() if e.undoes)
        self._clock = clock
        self._sleep = sleep

    @property
    def _lease_ms(self) -> int:
        return int(self._config.claim_lease_s * 1000)

    def handle(self, diagnosis: Diagnosis) -> Handled:
        """Dedup, plan and execute one diagnosis; raises `Busy` or `StateUnavailable`."""
        claim: Claim | None = None
        if not self._dry_run:
            status, claim, until = self._state.claim(
                diagnosis.id,
                diagnosis.state,
                self._actor,
                self._clock() // 1_000_000,
                self._lease_ms,
                self._config.dedup_ttl_s,
            )
            if status == "done":
                return Handled((), duplicate=True)
            if status == "busy" or claim is None:
                raise Busy(diagnosis.id, until)
        recorded = self._state.records(claim) if claim is not None else {}
        stored = recorded.get(PLAN_FIELD)
        if stored is not None:
            # Resuming: the plan was decided once; the state has since been changed by it.
            planned = _plan_from_json(stored)
        else:
            planned = plan(diagnosis, self._view(diagnosis), self._config, self._undoing)
            if claim is not None and not self._state.record(claim, PLAN_FIELD, _plan_json(planned)):
                return Handled((), claim, fenced=True)
        if claim is not None:
            self._mark(diagnosis, planned, claim)
        results: list[tuple[Step, Result]] = []
        for step in planned.steps:
            if step.conditional and not any(r.status == "failed" for _, r in results):
                continue
            prior = recorded.get(STEP_FIELD + step.key)
            if prior is not None:
                result = _result_from_json(prior)
            elif step.verdict is not None:
                result = step.verdict
            elif claim is None:
                result = skipped(Reason.DRY_RUN, "dry run: not executed")
            else:
                if not self._state.renew(claim, self._clock() // 1_000_000, self._lease_ms):
                    return Handled((), claim, fenced=True)
                result = self._execute(step, diagnosis, claim, results)
            if claim is not None and prior is None:
                if not self._state.record(claim, STEP_FIELD + step.key, _result_json(result)):
                    return Handled((), claim, fenced=True)
            results.append((step, result))
            if result.reason is Reason.FENCED:
                return Handled((), claim, fenced=True)
        now = self._clock()
        records = tuple(action_record(diagnosis, step, result, now) for step, result in results)
        return Handled(records, claim)

    def finish(self, handled: Handled) -> bool:
        """Mark the diagnosis handled, once its records are published; False when fenced."""
        if handled.claim is None or handled.duplicate or handled.fenced:
            return True
        return self._state.finish(handled.claim, self._config.dedup_ttl_s)

    def _view(self, diagnosis: Diagnosis) -> View:
        policy = self._config.policy
        job = diagnosis.job
        if job is None:
            return View()
        places = self._state.placement(job)
        rank_nodes = {rank: place.node for rank, place in (places or {}).items()}
        job_nodes = frozenset(rank_nodes.values()) if places is not None else None
        nodes = suspect_nodes(diagnosis, policy.min_score, View(rank_nodes=rank_nodes))
        now_ms, window_ms = self._clock() // 1_000_000, int(policy.suspect_window_s * 1000)
        if diagnosis.state == "firing" and not self._dry_run:
            self._state.note_suspects(job, nodes, now_ms, window_ms)
        recent = self._state.recent_suspects(job, now_ms, window_ms)
        leaves = self._state.node_leaves(sorted(set(nodes) | recent))
        return View(job_nodes, rank_nodes, recent, leaves)

    def _mark(self, diagnosis: Diagnosis, planned: Plan, claim: Claim) -> None:
        """Components named but not isolated become suspect; resolved, they become healthy."""
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
                # The reroute keeps it out of the plan: out of service until an operator
                # releases it (`c4 state release`, which gives it back to the plan).
                target_to, target_action = "isolated", "isolate"
                reason = f"{diagnosis.class_}: resolved by the reroute, kept out until released"
            self._state.transition(
                kind,
                ident,
                target_to,
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

    def _execute(
        self, step: Step, diagnosis: Diagnosis, claim: Claim, results: list[tuple[Step, Result]]
    ) -> Result:
        executor = self._executors[step.action]
        earlier = tuple(
            StepSummary(
                s.action, s.target, r.status, r.reason.value if r.reason else None, r.message
            )
            for s, r in results
        )
        context = Context(diagnosis, claim, earlier, self._actor, self._clock())
        backoff = executor.retry_for(step) or self._config.retry
        result = run_with_retry(lambda: executor.execute(step, context), backoff, self._sleep)
        if result.status == "failed":
            executor.give_up(step, result, context)
        return result

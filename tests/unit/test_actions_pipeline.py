"""The pipeline's stage chain against in-memory stores: dedup, resume, lease, retry, marks."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from actions.config import WorkerConfig, parse_config
from actions.pipeline.executor import Context, Executor
from actions.pipeline.outcome import Reason, Result, done, failed
from actions.pipeline.pipeline import Busy, Pipeline
from actions.pipeline.policy import Step
from actions.pipeline.recording import PLAN_FIELD, STEP_FIELD, result_json
from actions.state.model import Claim, Transition, TransitionRequest
from schemas.messages import Diagnosis, RankPlace

CLAIM = Claim("test:diagnosis:d-1:firing", "1")
NOW = 1_700_000_000_000_000_000


def diagnosis(cls: str = "noncomm_hang", state: str = "firing") -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": "d-1",
            "job": "job-1",
            "state": state,
            "class": cls,
            "onset_ns": 1,
            "ts_ns": 2,
            "suspects": [{"type": "node", "id": "node-002", "score": 0.9}],
        }
    )


@dataclass
class Claims:
    status: str = "claimed"
    fields: dict[str, str] = field(default_factory=dict)
    renewing: bool = True
    writable: bool = True
    finished: list[Claim] = field(default_factory=list)

    def claim(
        self, diagnosis: str, state: str, owner: str, now_ms: int, lease_ms: int, ttl_s: int
    ) -> tuple[str, Claim | None, int]:
        if self.status == "busy":
            return "busy", None, 1234
        return (self.status, CLAIM, 0) if self.status == "claimed" else ("done", None, 0)

    def renew(self, claim: Claim, now_ms: int, lease_ms: int) -> bool:
        return self.renewing

    def record(self, claim: Claim, name: str, value: str) -> bool:
        if self.writable:
            self.fields[name] = value
        return self.writable

    def records(self, claim: Claim) -> dict[str, str]:
        return dict(self.fields)

    def finish(self, claim: Claim, ttl_s: int) -> bool:
        self.finished.append(claim)
        return True


@dataclass
class Jobs:
    def placement(self, job: str) -> dict[int, RankPlace] | None:
        return {rank: RankPlace(rank=rank, node=f"node-00{rank}") for rank in range(4)}


@dataclass
class Suspects:
    noted: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def note(self, job: str, nodes: Iterable[str], now_ms: int, window_ms: int) -> None:
        self.noted.append((job, tuple(nodes)))

    def recent(self, job: str, now_ms: int, window_ms: int) -> frozenset[str]:
        return frozenset(node for noted, nodes in self.noted if noted == job for node in nodes)


@dataclass
class Components:
    requests: list[TransitionRequest] = field(default_factory=list)

    def transition(self, request: TransitionRequest) -> Transition:
        self.requests.append(request)
        return Transition("ok", epoch=1)

    def node_leaves(self, nodes: Iterable[str]) -> dict[str, tuple[str, ...]]:
        return {node: ("leaf-0a",) for node in nodes}


@dataclass
class State:
    claims: Claims = field(default_factory=Claims)
    jobs: Jobs = field(default_factory=Jobs)
    suspects: Suspects = field(default_factory=Suspects)
    components: Components = field(default_factory=Components)


class Scripted(Executor):
    """Answers from a script of results (then done); remembers its calls."""

    name = "scripted"

    def __init__(self, *results: Result) -> None:
        self.script = list(results)
        self.calls: list[tuple[str, Context]] = []
        self.given_up: list[Result] = []

    def execute(self, step: Step, context: Context) -> Result:
        self.calls.append((step.target, context))
        return self.script.pop(0) if self.script else done()

    def give_up(self, step: Step, result: Result, context: Context) -> None:
        self.given_up.append(result)


def config(**classes: list[str]) -> WorkerConfig:
    chosen = classes or {"noncomm_hang": ["isolate", "restart"]}
    return parse_config(
        {"policy": {"classes": chosen}, "retry": {"tries": 3, "backoff_s": 0.25}}, {}
    )


@dataclass
class Rig:
    state: State
    isolate: Scripted
    restart: Scripted
    pipeline: Pipeline
    slept: list[float]


def rig(*isolate: Result, dry_run: bool = False, settings: WorkerConfig | None = None) -> Rig:
    state, slept = State(), []
    isolating, restarting = Scripted(*isolate), Scripted()
    executors = {"isolate": isolating, "restart": restarting, "alert": Scripted()}
    chosen = settings or config()
    pipeline = Pipeline(
        state, executors, chosen, "test", dry_run, clock=lambda: NOW, sleep=slept.append
    )
    return Rig(state, isolating, restarting, pipeline, slept)


def test_a_claimed_diagnosis_is_planned_executed_and_recorded_in_its_claim() -> None:
    test = rig()
    handled = test.pipeline.handle(diagnosis())
    assert [(r.action, r.target, r.status) for r in handled.records] == [
        ("isolate", "node-002", "done"),
        ("restart", "job-1", "done"),
    ]
    assert handled.claim == CLAIM and not handled.duplicate and not handled.fenced
    fields = test.state.claims.fields
    assert set(fields) == {
        PLAN_FIELD,
        STEP_FIELD + "isolate|node-002|",
        STEP_FIELD + "restart|job-1|",
    }
    assert fields[STEP_FIELD + "restart|job-1|"] == result_json(done())
    ((_, context),) = test.isolate.calls
    assert context.claim == CLAIM and context.now_ns == NOW and context.earlier == ()
    ((_, later),) = test.restart.calls
    assert [(s.action, s.status) for s in later.earlier] == [("isolate", "done")]
    assert test.state.suspects.noted == [("job-1", ("node-002",))]
    assert test.pipeline.finish(handled) and test.state.claims.finished == [CLAIM]


def test_a_handled_diagnosis_is_a_duplicate_and_a_held_one_is_busy() -> None:
    test = rig()
    test.state.claims.status = "done"
    handled = test.pipeline.handle(diagnosis())
    assert handled.duplicate and handled.records == () and test.isolate.calls == []
    assert test.pipeline.finish(handled) and test.state.claims.finished == []
    test.state.claims.status = "busy"
    with pytest.raises(Busy) as busy:
        test.pipeline.handle(diagnosis())
    assert busy.value.until_ms == 1234


def test_a_claim_taken_over_resumes_its_plan_and_its_recorded_steps() -> None:
    first = rig(failed(Reason.STALE_EPOCH, "changed"))
    first.pipeline.handle(diagnosis())
    recorded = dict(first.state.claims.fields)
    recorded.pop(STEP_FIELD + "restart|job-1|")
    test = rig()
    test.state.claims.fields = recorded
    handled = test.pipeline.handle(diagnosis())
    assert test.isolate.calls == [] and [t for t, _ in test.restart.calls] == ["job-1"]
    assert [(r.action, r.status) for r in handled.records] == [
        ("isolate", "failed"),
        ("restart", "done"),
    ]
    assert test.state.suspects.noted == []  # the plan was read back, not decided again


def test_retryable_failures_are_retried_with_backoff_then_given_up() -> None:
    flaky = failed(Reason.STALE_EPOCH, "changed", retryable=True)
    test = rig(flaky, flaky, flaky)
    handled = test.pipeline.handle(diagnosis())
    isolate = handled.records[0]
    assert (isolate.status, isolate.detail["tries"]) == ("failed", 3)
    assert test.slept == [0.25, 0.5]
    assert test.isolate.given_up == [flaky.with_detail(tries=3)]
    assert len({id(context) for _, context in test.isolate.calls}) == 1


def test_a_lost_lease_or_a_refused_record_fences_the_diagnosis() -> None:
    test = rig()
    test.state.claims.renewing = False
    handled = test.pipeline.handle(diagnosis())
    assert handled.fenced and handled.records == () and test.isolate.calls == []
    assert test.pipeline.finish(handled) and test.state.claims.finished == []
    test = rig()
    test.state.claims.writable = False
    assert test.pipeline.handle(diagnosis()).fenced
    assert test.isolate.calls == []  # the plan could not be recorded
    fenced = rig(failed(Reason.FENCED, "taken over"))
    handled = fenced.pipeline.handle(diagnosis())
    assert handled.fenced and fenced.restart.calls == []


def test_a_dry_run_claims_marks_and_executes_nothing() -> None:
    test = rig(dry_run=True, settings=config(noncomm_hang=["isolate", "restart", "alert"]))
    handled = test.pipeline.handle(diagnosis())
    assert handled.claim is None and test.state.claims.fields == {}
    assert test.isolate.calls == [] and test.state.components.requests == []
    assert test.state.suspects.noted == []
    assert {(r.action, r.detail["reason"]) for r in handled.records} == {
        ("isolate", "dry_run"),
        ("restart", "dry_run"),
        ("alert", "no_receiver"),
    }


def test_named_components_not_isolated_are_marked_suspect_then_cleared() -> None:
    test = rig(settings=config(noncomm_hang=["restart"]))
    test.pipeline.handle(diagnosis())
    (mark,) = test.state.components.requests
    assert (mark.kind, mark.ident, mark.to, mark.action) == (
        "node",
        "node-002",
        "suspect",
        "suspect",
    )
    assert (mark.allowed_from, mark.claim, mark.diagnosis) == (("healthy",), CLAIM, "d-1")
    assert (mark.ts_ns, mark.now_ms, mark.only_own) == (NOW, NOW // 1_000_000, False)
    test = rig(settings=config(noncomm_hang=["restart"]))
    test.pipeline.handle(diagnosis(state="resolved"))
    (clear,) = test.state.components.requests
    assert (clear.to, clear.action, clear.allowed_from, clear.only_own) == (
        "healthy",
        "clear",
        ("suspect",),
        True,
    )
    assert test.restart.calls == []  # a restart is not undone

"""What the pipeline writes down: the plan and each step's result in the diagnosis's claim,
and each step's v1 action record.

The claim's record (JSON per field) is what a worker taking a claim over resumes from: the
plan decided once, the steps already done. The action record's id is stable per diagnosis,
state and step, so a record published again keeps its id.
"""

from __future__ import annotations

import hashlib

import orjson

from actions.pipeline.outcome import Reason, Result
from actions.pipeline.policy import Plan, Step
from schemas.messages import Action, Diagnosis

STEP_FIELD = "step:"  # + the step's key: its result
PLAN_FIELD = "plan"


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


def result_json(result: Result) -> str:
    """A step's result as its claim field holds it."""
    return orjson.dumps(
        {
            "status": result.status,
            "reason": result.reason.value if result.reason else None,
            "message": result.message,
            "detail": dict(result.detail),
        }
    ).decode()


def result_from_json(text: str) -> Result:
    """A step's result read back from its claim field (never retryable: it is final)."""
    data = orjson.loads(text)
    reason = Reason(data["reason"]) if data["reason"] else None
    return Result(data["status"], reason, data["message"], False, data["detail"])


def plan_json(planned: Plan) -> str:
    """A plan as the claim's plan field holds it."""
    steps = [
        {
            "action": step.action,
            "target": step.target,
            "kind": step.kind,
            "nodes": list(step.nodes),
            "receiver": step.receiver,
            "escalation": step.escalation,
            "conditional": step.conditional,
            "verdict": result_json(step.verdict) if step.verdict else None,
        }
        for step in planned.steps
    ]
    marks = [list(mark) for mark in planned.marks]
    return orjson.dumps({"steps": steps, "marks": marks, "clears": planned.clears}).decode()


def plan_from_json(text: str) -> Plan:
    """A plan read back from the claim's plan field."""
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
            result_from_json(item["verdict"]) if item["verdict"] else None,
        )
        for item in data["steps"]
    )
    marks = tuple((kind, ident) for kind, ident in data["marks"])
    return Plan(steps, marks, data["clears"])

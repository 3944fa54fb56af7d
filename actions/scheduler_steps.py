"""What the scheduler drivers' executors share (Slurm, Kubernetes): the part's node, the
retry policy, a scheduler's failure as a step result and the dead letter at the end."""

from __future__ import annotations

from typing import Protocol

from pydantic import JsonValue

from actions.config import Backoff, Scheduler
from actions.executors import Context, DeadLetterSink, Executor, step_letter
from actions.outcome import Reason, Result, failed
from actions.policy import Step

# The parts of a node a drain or cordon takes out with it: the node itself, its GPUs, ports.
NODE_PARTS = frozenset({"node", "gpu", "port"})


class SchedulerFailure(Protocol):
    """A scheduler driver's error: its text, and whether trying again may help."""

    retryable: bool


def node_of(kind: str, target: str) -> str | None:
    """The node that holds a part (``node-001/gpu3`` -> ``node-001``); None for links and
    switches, which no scheduler drains."""
    if kind not in NODE_PARTS:
        return None
    return target.split("/", 1)[0]


def scheduler_failure(error: SchedulerFailure, **detail: JsonValue) -> Result:
    """A scheduler command's failure as a step result."""
    if error.retryable:
        return failed(Reason.SCHEDULER_UNAVAILABLE, str(error), True, **detail)
    return failed(Reason.SCHEDULER_REJECTED, str(error), False, **detail)


class SchedulerStep(Executor):
    """A scheduler's step: its retry policy and, when it fails for good, a dead letter on
    topic ``<driver>:<action>`` carrying what it would have run."""

    driver = "scheduler"

    def __init__(self, scheduler: Scheduler, dead_letter: DeadLetterSink) -> None:
        self._scheduler = scheduler
        self._dead_letter = dead_letter

    def retry_for(self, step: Step) -> Backoff | None:
        del step
        return self._scheduler.retry

    def give_up(self, step: Step, result: Result, context: Context) -> None:
        if result.reason not in (Reason.SCHEDULER_UNAVAILABLE, Reason.SCHEDULER_REJECTED):
            return
        commands = "\n".join(self.preview(step, context.diagnosis))
        letter = step_letter(f"{self.driver}:{self.name}", context, result, commands)
        self._dead_letter(letter, step.target)

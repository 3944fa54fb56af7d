"""What the scheduler drivers' executors share (Slurm, Kubernetes): the part's node, the
retry policy, a scheduler's failure as a step result and the dead letter at the end."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import ClassVar

from pydantic import JsonValue

from actions import SchedulerError
from actions.config import Backoff, Scheduler, WorkerConfig
from actions.drivers.state.executors import IsolateExecutor
from actions.pipeline.executor import Context, DeadLetterSink, Executor, step_letter
from actions.pipeline.outcome import Reason, Result, failed, skipped
from actions.pipeline.policy import Step
from actions.state.protocols import ComponentStates

# The parts of a node a drain or cordon takes out with it: the node itself, its GPUs, ports.
NODE_PARTS = frozenset({"node", "gpu", "port"})


def node_of(kind: str, target: str) -> str | None:
    """The node that holds a part (``node-001/gpu3`` -> ``node-001``); None for links and
    switches, which no scheduler drains."""
    if kind not in NODE_PARTS:
        return None
    return target.split("/", 1)[0]


def scheduler_failure(error: SchedulerError, **detail: JsonValue) -> Result:
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


class NodeIsolateStep(SchedulerStep):
    """The cluster state's isolation, then the scheduler takes the part's node out of
    service (`take_out`); a refused transition takes nothing out, and a link or a switch
    is the state's alone."""

    name = "isolate"
    taken_out: ClassVar[str] = "taken_out"  # a test's crash point once the node is out

    def __init__(
        self,
        components: ComponentStates,
        config: WorkerConfig,
        dead_letter: DeadLetterSink,
        checkpoint: Callable[[str], None] = lambda name: None,
    ) -> None:
        super().__init__(config.scheduler, dead_letter)
        self._components = components
        self._state = IsolateExecutor(components, config)
        self._checkpoint = checkpoint

    @abc.abstractmethod
    def take_out(self, node: str, step: Step, context: Context) -> str:
        """Take the node out in the scheduler, checked against its state; the answer."""

    def _isolated_by(self, step: Step, diagnosis: str) -> bool:
        """Whether this diagnosis isolated the part already (a retry after a crash)."""
        current = self._components.component(step.kind, step.target)
        return current is not None and current.diagnosis == diagnosis

    @abc.abstractmethod
    def earlier_run(self, node: str, context: Context) -> str | None:
        """Why the finding (of a part of ``node``) is about a run of its job that the
        scheduler has replaced since (a restart for another finding), None when it is not
        or cannot be told."""

    def execute(self, step: Step, context: Context) -> Result:
        node = node_of(step.kind, step.target)
        if node is not None and not self._isolated_by(step, context.diagnosis.id):
            # A finding about a run the job has left (its last reports came after a restart
            # for another finding of the same fault) takes nothing out: that finding did, and
            # a node given back since must stay in service. Checked before the state changes.
            try:
                why = self.earlier_run(node, context)
            except SchedulerError as error:
                return scheduler_failure(error, node=node)
            if why is not None:
                return skipped(Reason.EARLIER_RUN, why, node=node)
        recorded = self._state.execute(step, context)
        if recorded.status != "done" or node is None:
            return recorded
        try:
            answer = self.take_out(node, step, context)
        except SchedulerError as error:
            return scheduler_failure(error, node=node)
        self._checkpoint(self.taken_out)  # a test's crash point: out, not recorded
        # "held": a person took the node out already; it is out of service all the same.
        return recorded.with_detail(node=node, **{self.driver: answer})

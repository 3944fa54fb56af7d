"""The Executor interface: one per action name, each with one small method (`Executor.execute`).

The pipeline looks an action up by name in a mapping, so a new action (reroute) is one more
entry, not a change of the pipeline; the drivers (`actions.drivers`) implement it. An executor
changes state only through the stores' scripts (atomic, fenced by the claim, compared against
epochs), reached through the narrow Protocols of `actions.state.protocols` it needs, and
answers with a `Result`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from actions.config import Backoff
from actions.pipeline.outcome import Result, StepSummary
from actions.pipeline.policy import Step
from actions.state.model import Claim
from schemas.messages import Deadletter, Diagnosis

DeadLetterSink = Callable[[Deadletter, str], None]  # publish a dead letter under a key


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

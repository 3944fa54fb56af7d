"""One interface for detection, per key, in the Bytewax style: messages and timers in,
diagnoses out, each key's state taken out and put back as plain data.

A stage holds the state of many keys (jobs, nodes). Whatever runs it (the offline replay,
a live worker on Kafka) only feeds it and keeps its state; nothing outside the stage reaches
into it:

- ``on_message`` takes one input message, ``on_timer`` moves its event-time clock on while
  the input is silent and judges again what waited, ``on_eof`` judges everything once the
  input ended (a replay's end);
- ``key_of`` says which key's state a message changes, ``key_of_finding`` which key's state
  holds a finding: so the runtime knows what to restore before a message and what to
  snapshot after one, and routes messages of one key to one worker;
- ``snapshot``, ``restore`` and ``drop`` move a key's state out, in and away (a restarted
  worker restores from a changelog-backed table, a revoked partition's keys are dropped).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.base import C4Model
from schemas.messages import (
    Collective,
    Collectives,
    Diagnosis,
    Gpu,
    Gpus,
    Job,
    Link,
    Links,
    Member,
    Neighbours,
)
from streams.core.split import JobShare

JOB = "job"  # a job's detectors: keyed like its collective, job and member messages
NODE = "node"  # a node's hardware monitor state: keyed like its link and gpu messages
KEY_KINDS = (JOB, NODE)

# The findings held in a node's state rather than a job's (of a node's own part: a
# ``link_down`` of a NIC port; the fabric correlator's, of a fabric link, is no node's).
HARDWARE_CLASSES = frozenset({"link_down", "gpu_fault", "miscabled"})
# Suspects of the fabric itself: a finding naming one first belongs to no node.
FABRIC_SUSPECTS = frozenset({"link", "switch"})

# One key's state as plain data (JSON types): what a snapshot holds and a restore takes.
KeyState = dict[str, Any]


@dataclass(frozen=True, slots=True)
class StateKey:
    """A key of a stage's state: its kind (`JOB`, `NODE`) and the id (job id, node name),
    which is also the key of its input records on Kafka."""

    kind: str
    id: str


def state_key(message: C4Model) -> StateKey | None:
    """The key whose state a message changes; None for facts every key may read (route
    plans)."""
    if isinstance(message, Collective | Collectives | Job | Member):
        return StateKey(JOB, message.job)
    if isinstance(message, Link | Gpu | Neighbours | Links | Gpus):
        return StateKey(NODE, message.node)
    return None


def finding_key(diagnosis: Diagnosis) -> StateKey | None:
    """The key whose state holds a finding: a hardware finding its node's (a degraded link
    when its first suspect is a port), any other its job's; None for a finding of no job
    (the fabric's: a ``link_down`` or ``link_degraded`` naming a fabric link or switch)."""
    suspects = diagnosis.suspects
    hardware = diagnosis.class_ in HARDWARE_CLASSES or (
        diagnosis.class_ == "link_degraded" and bool(suspects) and suspects[0].type == "port"
    )
    if hardware and suspects and suspects[0].type not in FABRIC_SUSPECTS:
        return StateKey(NODE, suspects[0].id.split("/", 1)[0])
    if diagnosis.job is not None:
        return StateKey(JOB, diagnosis.job)
    return None


class DetectionStage(Protocol):
    """What a runtime drives detection through: per key, messages and timers in, diagnoses
    (firing or resolved, as they change) out, the keys' state out and back in."""

    @property
    def now_ns(self) -> int:
        """The stage's event-time clock: the latest time it saw (never goes back)."""
        ...

    def key_of(self, message: C4Model) -> StateKey | None:
        """The key whose state ``message`` changes (None: a fact any key may read)."""
        ...

    def key_of_finding(self, diagnosis: Diagnosis) -> StateKey | None:
        """The key whose state holds the finding ``diagnosis`` is of."""
        ...

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """Take one message (of the key ``key_of`` names); the diagnoses it changed."""
        ...

    def on_timer(self, now_ns: int) -> list[Diagnosis]:
        """The runtime's timer: judge again what waited for other inputs, and move event
        time to ``now_ns`` (the input silent that long; a time not ahead of the clock moves
        nothing), running the checks that makes due."""
        ...

    def on_progress(self) -> None:
        """The runtime measured again which of its inputs are behind (the stage's
        ``InputProgress``): what waited on that is asked anew at the next message."""
        ...

    def on_barrier(self, shares: list[JobShare], latest_ns: int) -> list[Diagnosis]:
        """A barrier of node stages (`streams.core.split`): what they handed on, then the
        clock moved to the latest event time of it (`NOT_YET`: not moved)."""
        ...

    def on_eof(self) -> list[Diagnosis]:
        """The input ended: judge every key at the clock's time."""
        ...

    def keys(self, kind: str) -> list[StateKey]:
        """The keys of ``kind`` whose state the stage holds now."""
        ...

    def snapshot(self, keys: Collection[StateKey]) -> dict[StateKey, KeyState]:
        """The state of each of ``keys`` held here, as plain data; a key holding nothing is
        left out (its snapshot is to be deleted). One call for many keys: some state is
        read in one pass for all of them."""
        ...

    def restore(self, key: StateKey, state: KeyState) -> None:
        """Take ``key`` over from its snapshot (its findings were published before)."""
        ...

    def drop(self, key: StateKey) -> None:
        """Forget ``key`` (its partition went to another worker, or its snapshot could not
        be read and it is relearnt)."""
        ...

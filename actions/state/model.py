"""The values the cluster-state stores take and give: components, claims, requests, answers.

Pure (no Redis): the executors and the pipeline stages name these types and the Protocols of
`actions.state.protocols`, never a store's implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

STATES = ("healthy", "suspect", "isolated", "spare")


@dataclass(frozen=True, slots=True)
class Component:
    """One component's recorded state."""

    kind: str
    id: str
    state: str
    epoch: int
    reason: str = ""
    diagnosis: str = ""
    ts_ns: int = 0


@dataclass(frozen=True, slots=True)
class Claim:
    """A worker's claim on one diagnosis: the key of its record and its fence token."""

    key: str
    fence: str


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Per-job and cluster-wide limits on state-changing actions."""

    job: int
    cluster: int
    window_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TransitionRequest:
    """One component state change (scripts.TRANSITION): what, to which state, why, by whom.

    ``allowed_from`` lists the states it may leave (empty: any); ``expected_epoch`` fails it
    when the component changed meanwhile; ``claim`` fences it to the diagnosis's holder;
    ``limits`` counts it (under ``rate_member``) against the job's and the cluster's rate;
    ``only_own`` changes a component only while it is marked by this diagnosis.
    """

    kind: str
    ident: str
    to: str
    action: str
    reason: str
    ts_ns: int
    now_ms: int
    actor: str
    diagnosis: str = ""
    allowed_from: tuple[str, ...] = ()
    expected_epoch: int | None = None
    claim: Claim | None = None
    job: str | None = None
    limits: RateLimits | None = None
    rate_member: str = ""
    only_own: bool = False


@dataclass(frozen=True, slots=True)
class Transition:
    """What a transition script answered: ``ok same unknown fenced stale refused
    rate_limited``, with the epoch, the current state or the limit that was hit."""

    outcome: str
    epoch: int = 0
    state: str = ""
    diagnosis: str = ""
    limit: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationRequest:
    """Spares for a job's failed nodes (scripts.ALLOCATE), fenced by the diagnosis's claim."""

    claim: Claim
    job: str
    nodes: tuple[str, ...]
    max_restarts: int
    ts_ns: int
    now_ms: int
    diagnosis: str
    actor: str
    limits: RateLimits
    rate_member: str


def allocation_field(job: str) -> str:
    """The claim field holding a job's allocation record."""
    return f"alloc:{job}"

"""The narrow interfaces of the cluster-state stores, one per use (pure: no Redis).

Executors, the pipeline's stages and the worker loop depend on these, never on a store's
implementation; the stores of `actions.state` (`ComponentStore`, `JobStore`,
`SuspectStore`, `ClaimStore`, `AlertStore`) have them by structure, and the tests give small fakes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from actions.state.model import (
    AllocationRequest,
    Claim,
    Component,
    Transition,
    TransitionRequest,
)
from schemas.messages import Job, RankPlace
from topology.model import Fabric

# --- components (actions.state.components.ComponentStore) --------------------------------


class Transitions(Protocol):
    """Change a component's state (the pipeline's mark stage)."""

    def transition(self, request: TransitionRequest) -> Transition:
        """Change one component's state atomically, audited (scripts.TRANSITION)."""


class ComponentStates(Transitions, Protocol):
    """Read a component's state, then change it against its epoch (the isolate executor)."""

    def component(self, kind: str, ident: str) -> Component | None:
        """One component's state, None when the topology does not have it."""


class NodeLeaves(Protocol):
    """Where nodes hang off the fabric (the pipeline's view for the blast radius)."""

    def node_leaves(self, nodes: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The leaves each node's ports hang off (empty for unknown nodes)."""


class FabricSource(Protocol):
    """The fabric of the topology loaded (the reroute, ``c4 actions worker``'s start check)."""

    def fabric(self) -> Fabric | None:
        """The fabric of the topology loaded; None when none was; `StateError` if invalid."""


# --- jobs (actions.state.jobs.JobStore) ----------------------------------------------------


class JobRecorder(Protocol):
    """Record the placements of ``c4.job.v1`` (the worker loop)."""

    def record(self, job: Job) -> bool:
        """Record a placement unless a newer one is; True when kept."""


class Placements(Protocol):
    """One job's ranks (the pipeline's view)."""

    def placement(self, job: str) -> dict[int, RankPlace] | None:
        """A job's recorded ranks, None when the job is unknown."""


class ActiveJobs(Protocol):
    """The running jobs' placements (the reroute plans their flows)."""

    def active(self) -> list[Job]:
        """Every recorded job that is not stopped; `StateError` when one is not valid."""


class Allocations(Protocol):
    """Spares for a job, and the placement that results (the restart executor)."""

    def allocate(self, request: AllocationRequest) -> list[str]:
        """Take spares and rewrite the placement (scripts.ALLOCATE); the script's answer."""

    def message(self, job: str, ts_ns: int, state: str = "restarting") -> Job:
        """The job's recorded placement as a v1 job message; `StateError` when unknown."""


class RestartCounts(Protocol):
    """A job's restarts as a scheduler driver counts them (Kubernetes)."""

    def counted_for(self, job: str, diagnosis: str) -> bool:
        """Whether a restart was counted for the diagnosis."""

    def count_restart(self, job: str, diagnosis: str, max_restarts: int) -> tuple[str, int]:
        """Count one restart for a diagnosis (once, under the limit): the answer (counted,
        again, limit, unknown_job) and the count."""


class NodeJobs(Protocol):
    """Which jobs run on a node (adding a spare)."""

    def on_node(self, node: str) -> list[str]:
        """The recorded jobs (not stopped) that have a rank on a node."""


# --- suspects (actions.state.suspects.SuspectStore) ---------------------------------------


class SuspectWindow(Protocol):
    """A job's suspect nodes over the blast-radius window (the pipeline's view)."""

    def note(self, job: str, nodes: Iterable[str], now_ms: int, window_ms: int) -> None:
        """Remember a job's suspect nodes for the window."""

    def recent(self, job: str, now_ms: int, window_ms: int) -> frozenset[str]:
        """A job's suspect nodes seen within the window."""


# --- claims (actions.state.claims.ClaimStore) ---------------------------------------------


class ClaimRecords(Protocol):
    """The fields of a diagnosis's claim (executors resuming their phases)."""

    def records(self, claim: Claim) -> dict[str, str]:
        """Every field of the claim's record."""

    def record(self, claim: Claim, field: str, value: str) -> bool:
        """Write one field of the claim's record; False when another worker took it over."""


class Claims(ClaimRecords, Protocol):
    """Claim, lease, record and finish a diagnosis (the pipeline's stages)."""

    def claim(
        self, diagnosis: str, state: str, owner: str, now_ms: int, lease_ms: int, ttl_s: int
    ) -> tuple[str, Claim | None, int]:
        """("claimed", claim, 0), ("done", None, 0) or ("busy", None, lease until ms)."""

    def renew(self, claim: Claim, now_ms: int, lease_ms: int) -> bool:
        """Extend the claim's lease; False when another worker has taken it over."""

    def finish(self, claim: Claim, ttl_s: int) -> bool:
        """Mark the diagnosis handled; False when another worker has taken it over."""


# --- alerts (actions.state.alerts.AlertStore) ---------------------------------------------


class ActiveAlerts(Protocol):
    """The alerts kept per Alertmanager receiver until they resolved (the alert executor)."""

    def keep(self, receiver: str, diagnosis: str, alert: str) -> None:
        """Keep (or replace) a diagnosis's alert for a receiver."""

    def forget(self, receiver: str, diagnosis: str) -> None:
        """Stop resending a diagnosis's alert."""

    def kept(self, receiver: str, diagnosis: str) -> str | None:
        """A diagnosis's kept alert, None when none is."""

    def all_kept(self, receiver: str) -> dict[str, str]:
        """Every kept alert of a receiver: diagnosis id -> alert."""

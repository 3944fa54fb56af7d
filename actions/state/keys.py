"""The Redis key of every piece of cluster state (docs/redis-state.md lists them all).

Every key starts with a configurable prefix (default ``c4``), so tests and several clusters
share one Redis without meeting. A prefix in braces (``{c4}``) puts every key in one
Redis Cluster slot, which the Lua scripts need there.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("node", "gpu", "port", "link", "switch")


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix."""

    prefix: str = "c4"

    def obj(self, kind: str, ident: str) -> str:
        """Hash of one component: state, reason, diagnosis, ts_ns, epoch (+ node topology)."""
        return f"{self.prefix}:{kind}:{ident}"

    def index(self, kind: str) -> str:
        """Set of the ids of every component of a kind."""
        return f"{self.prefix}:index:{kind}"

    @property
    def topology(self) -> str:
        """String: the v1 topology document last loaded."""
        return f"{self.prefix}:topology"

    @property
    def spares(self) -> str:
        """Set: the spare pool (node ids)."""
        return f"{self.prefix}:spares"

    @property
    def jobs(self) -> str:
        """Set: the ids of every job recorded."""
        return f"{self.prefix}:jobs"

    def job(self, job: str) -> str:
        """Hash of a job: state, ts_ns, restarts, epoch, comms (JSON)."""
        return f"{self.prefix}:job:{job}"

    def job_ranks(self, job: str) -> str:
        """Hash of a job's placement: global rank -> ``node|gpu|port``."""
        return f"{self.prefix}:job:{job}:ranks"

    def job_restarted_for(self, job: str) -> str:
        """The diagnoses a scheduler restarted the job for (a set: each counted once)."""
        return f"{self.prefix}:job:{job}:restarted-for"

    def job_suspects(self, job: str) -> str:
        """Sorted set: a job's recently suspected nodes, scored by wall-clock ms."""
        return f"{self.prefix}:job:{job}:suspects"

    def claim(self, diagnosis: str, state: str) -> str:
        """Hash: the claim on one diagnosis (id and state), its fence and its step records."""
        return f"{self.prefix}:diagnosis:{diagnosis}:{state}"

    def alerts(self, receiver: str) -> str:
        """Hash: an Alertmanager receiver's kept alerts, diagnosis id -> alert (JSON)."""
        return f"{self.prefix}:alerts:{receiver}"

    @property
    def rate_cluster(self) -> str:
        """Sorted set: state-changing actions cluster-wide, scored by wall-clock ms."""
        return f"{self.prefix}:rate:cluster"

    def rate_job(self, job: str) -> str:
        """Sorted set: state-changing actions on one job, scored by wall-clock ms."""
        return f"{self.prefix}:rate:job:{job}"

    @property
    def audit(self) -> str:
        """Stream: one entry per state change."""
        return f"{self.prefix}:audit"

"""`RedisState`: the cluster state under one key prefix, as the stores over one client.

A façade for wiring code: it owns the Redis client and hands out one store per job —
``components`` (`ComponentStore`: topology, states, transitions, spares), ``jobs``
(`JobStore`: placements, allocations), ``suspects`` (`SuspectStore`), ``claims``
(`ClaimStore`), ``alerts`` (`AlertStore`) and ``audit`` (`AuditLog`). Executors and the
pipeline's stages take only the Protocols of `actions.state.protocols` they use, never this
class.
"""

from __future__ import annotations

from typing import Any

import redis

from actions.state.alerts import AlertStore
from actions.state.audit import AuditLog
from actions.state.base import connect
from actions.state.claims import ClaimStore
from actions.state.components import ComponentStore
from actions.state.jobs import JobStore
from actions.state.keys import Keys
from actions.state.suspects import SuspectStore


class RedisState:
    """The cluster state under one key prefix."""

    def __init__(self, client: redis.Redis, prefix: str = "c4") -> None:
        self.client = client
        self.keys = Keys(prefix)
        self.jobs = JobStore(client, self.keys)
        self.components = ComponentStore(client, self.keys, self.jobs)
        self.suspects = SuspectStore(client, self.keys)
        self.claims = ClaimStore(client, self.keys)
        self.alerts = AlertStore(client, self.keys)
        self.audit = AuditLog(client, self.keys)

    @classmethod
    def connect(cls, url: str, password: str | None = None, prefix: str = "c4") -> RedisState:
        """A client for a Redis URL, with socket timeouts so an outage is seen quickly."""
        return cls(connect(url, password), prefix)

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    def snapshot(self) -> dict[str, Any]:
        """Everything ``c4 state show`` prints: counts, non-healthy components, spares, jobs."""
        return {
            "prefix": self.keys.prefix,
            "components": self.components.summary(),
            "spares": self.components.spares(),
            "jobs": self.jobs.summary(),
            "audit_entries": self.audit.length(),
        }

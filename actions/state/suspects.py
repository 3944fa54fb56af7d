"""`SuspectStore`: each job's recently suspected nodes, for the blast-radius window.

A sorted set per job scored by wall-clock ms: entries older than the window are dropped when
new ones come, and the key expires with the window.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from actions.state.base import guarded, text
from actions.state.keys import Keys


class SuspectStore:
    """Jobs' suspect nodes under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    @guarded
    def note(self, job: str, nodes: Iterable[str], now_ms: int, window_ms: int) -> None:
        """Remember a job's suspect nodes for the blast-radius window."""
        key = self._keys.job_suspects(job)
        members = {node: now_ms for node in nodes}
        if not members:
            return
        pipe = self._client.pipeline(transaction=True)
        pipe.zadd(key, members)
        pipe.zremrangebyscore(key, "-inf", f"({now_ms - window_ms}")
        pipe.pexpire(key, window_ms)
        pipe.execute()

    @guarded
    def recent(self, job: str, now_ms: int, window_ms: int) -> frozenset[str]:
        """A job's suspect nodes seen within the window."""
        key = self._keys.job_suspects(job)
        found = self._client.zrangebyscore(key, now_ms - window_ms, "+inf")
        return frozenset(text(node) for node in found)

"""`AuditLog`: the audit stream, read side (one entry per state change).

The entries are written by the transition and allocation scripts in the same atomic step as
the change they record; this store only reads them back.
"""

from __future__ import annotations

import redis

from actions.state.base import guarded, text
from actions.state.keys import Keys


class AuditLog:
    """The audit stream under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    @guarded
    def entries(self, count: int = 100) -> list[dict[str, str]]:
        """The newest audit entries, oldest first."""
        found = self._client.xrevrange(self._keys.audit, count=count) or []
        return [
            {"id": text(entry_id), **{text(k): text(v) for k, v in (fields or {}).items()}}
            for entry_id, fields in reversed(found)
        ]

    @guarded
    def length(self) -> int:
        """How many entries the stream holds."""
        return int(self._client.xlen(self._keys.audit))

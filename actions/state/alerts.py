"""`AlertStore`: the alerts each Alertmanager receiver is sent again until they resolved.

One hash per receiver, diagnosis id -> the kept alert (JSON of
`actions.drivers.alertmanager.v2.Kept`). Kept in the cluster state, not in a worker: a
restarted worker, or another one of the group, goes on resending them.
"""

from __future__ import annotations

import redis

from actions.state.base import guarded, text
from actions.state.keys import Keys


class AlertStore:
    """Receivers' kept alerts under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    @guarded
    def keep(self, receiver: str, diagnosis: str, alert: str) -> None:
        """Keep (or replace) a diagnosis's alert for a receiver."""
        self._client.hset(self._keys.alerts(receiver), diagnosis, alert)

    @guarded
    def forget(self, receiver: str, diagnosis: str) -> None:
        """Stop resending a diagnosis's alert."""
        self._client.hdel(self._keys.alerts(receiver), diagnosis)

    @guarded
    def kept(self, receiver: str, diagnosis: str) -> str | None:
        """A diagnosis's kept alert, None when none is."""
        value = self._client.hget(self._keys.alerts(receiver), diagnosis)
        return None if value is None else text(value)

    @guarded
    def all_kept(self, receiver: str) -> dict[str, str]:
        """Every kept alert of a receiver: diagnosis id -> alert."""
        found = self._client.hgetall(self._keys.alerts(receiver))
        return {text(k): text(v) for k, v in found.items()}

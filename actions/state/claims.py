"""`ClaimStore`: one claim per diagnosis (id and state): dedup, lease, fencing, records.

A worker claims a diagnosis before acting on it; a live claim of another worker makes it
busy, a handled one a duplicate, and a claim whose lease ran out is taken over with a new
fence token. Every write of the claim's record (plan, step results, executor phases) is
refused to a worker whose token is no longer the claim's (scripts CLAIM RENEW RECORD FINISH).
"""

from __future__ import annotations

import redis

from actions.state import scripts as lua
from actions.state.base import guarded, text
from actions.state.keys import Keys
from actions.state.model import Claim


class ClaimStore:
    """Claims on diagnoses under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self._claim = client.register_script(lua.PRELUDE + lua.CLAIM)
        self._renew = client.register_script(lua.PRELUDE + lua.RENEW)
        self._record = client.register_script(lua.PRELUDE + lua.RECORD)
        self._finish = client.register_script(lua.PRELUDE + lua.FINISH)

    @guarded
    def claim(
        self, diagnosis: str, state: str, owner: str, now_ms: int, lease_ms: int, ttl_s: int
    ) -> tuple[str, Claim | None, int]:
        """Claim a diagnosis: ("claimed", claim, 0), ("done", None, 0) or ("busy", None, until)."""
        key = self._keys.claim(diagnosis, state)
        answer = [text(x) for x in self._claim(keys=[key], args=[owner, now_ms, lease_ms, ttl_s])]
        if answer[0] == "claimed":
            return "claimed", Claim(key, answer[1]), 0
        if answer[0] == "busy":
            return "busy", None, int(answer[1])
        return "done", None, 0

    @guarded
    def renew(self, claim: Claim, now_ms: int, lease_ms: int) -> bool:
        """Extend the claim's lease; False when another worker has taken it over."""
        return bool(self._renew(keys=[claim.key], args=[claim.fence, now_ms, lease_ms]))

    @guarded
    def record(self, claim: Claim, field: str, value: str) -> bool:
        """Write one field of the claim's record (step outcomes, phases); False when fenced."""
        return bool(self._record(keys=[claim.key], args=[claim.fence, field, value]))

    @guarded
    def records(self, claim: Claim) -> dict[str, str]:
        """Every field of the claim's record."""
        return {text(k): text(v) for k, v in self._client.hgetall(claim.key).items()}

    @guarded
    def finish(self, claim: Claim, ttl_s: int) -> bool:
        """Mark the diagnosis handled (later deliveries are duplicates); False when fenced."""
        return bool(self._finish(keys=[claim.key], args=[claim.fence, ttl_s]))

"""The plan in force, kept in Redis for the reroute action.

Keys, under a configurable prefix (default ``c4:plan:``; the worker uses the cluster state's
prefix + ``:plan:``):
- ``<prefix>current``: a hash, the plan in force (``id``, ``plan`` as v1 JSON with each
  path's ``sport``, ``down`` as a JSON list, ``ts_ns``, ``diagnosis``);
- ``<prefix>history``: a list, the latest plan ids first (the last 100).

The jobs' placements the plans are made from are the cluster state's (`JobStore.active`).
A change is one Lua script, atomic against other workers. Replacing the plan is a
compare-and-set on the id it was computed from: a worker that replanned from a plan that is
no longer in force gets `StalePlanError` and replans from the fresh one; saving the same
plan id twice (a retry) is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis
from pydantic import ValidationError

from actions import ActionsError
from planner.core import plan_from_json, plan_json
from planner.reroute import CurrentPlan

DEFAULT_PREFIX = "c4:plan:"
HISTORY = 100

_REPLACE = """
local current = redis.call('HGET', KEYS[1], 'id')
if current == ARGV[1] then return 2 end
if (current or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'plan', ARGV[3], 'down', ARGV[4],
           'ts_ns', ARGV[5], 'diagnosis', ARGV[6])
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[7]) - 1)
return 1
"""


class PlanStoreError(ActionsError):
    """The plan store could not be read or written; the message is one line."""


class StalePlanError(PlanStoreError):
    """The plan in force changed since it was read: replan from the fresh one."""


class StoreUnavailableError(PlanStoreError):
    """Redis did not answer; trying again later may help."""


@dataclass(frozen=True, slots=True)
class Saved:
    """What `PlanStore.replace` did: stored the plan, or found it already stored."""

    stored: bool


class PlanStore:
    """The plan in force and its history, under one key prefix of one Redis."""

    def __init__(self, client: redis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self.prefix = prefix
        self._current = f"{prefix}current"
        self._history = f"{prefix}history"
        self._replace = client.register_script(_REPLACE)
        # The plan in force as last read or stored here. A plan id names one plan (it is a
        # hash of what made it), so while the id in Redis is the same, this object is the
        # plan: no re-parse of a large plan, and the planner keeps its standing state for it.
        self._last: CurrentPlan | None = None

    @classmethod
    def from_url(
        cls, url: str, password: str | None = None, prefix: str = DEFAULT_PREFIX
    ) -> PlanStore:
        """A store on a new client of ``url`` (5 s socket timeouts)."""
        client = redis.Redis.from_url(
            url, password=password, socket_timeout=5, socket_connect_timeout=5
        )
        return cls(client, prefix)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    def current(self) -> CurrentPlan | None:
        """The plan in force, or None when no plan was ever stored."""
        ident = cast("bytes | None", self._call(self._client.hget, self._current, "id"))
        if (
            ident is not None
            and self._last is not None
            and self._last.id == ident.decode(errors="replace")
        ):
            return self._last
        fields = cast("dict[bytes, bytes]", self._call(self._client.hgetall, self._current))
        if not fields:
            return None
        try:
            diagnosis = fields.get(b"diagnosis", b"").decode()
            down = orjson.loads(fields[b"down"])
            if not isinstance(down, list) or not all(isinstance(x, str) for x in down):
                error = "down is not a list of link ids"
                raise ValueError(error)
            self._last = CurrentPlan(
                id=fields[b"id"].decode(),
                plan=plan_from_json(fields[b"plan"]),
                down=tuple(down),
                ts_ns=int(fields[b"ts_ns"]),
                diagnosis=diagnosis or None,
            )
            return self._last
        except (KeyError, ValueError, UnicodeDecodeError, ValidationError) as error:
            first = str(error).splitlines()[0] if str(error) else type(error).__name__
            message = f"{self._current} holds no valid plan: {first}"
            raise PlanStoreError(message) from None

    def replace(self, new: CurrentPlan, expected: str | None) -> Saved:
        """Put ``new`` in force if the plan in force is still ``expected`` (None: no plan).

        Raises `StalePlanError` when another plan is in force; a retry of the same plan id is
        a no-op (``stored`` False).
        """
        answer = self._call(
            self._replace,
            keys=[self._current, self._history],
            args=[
                new.id,
                expected or "",
                plan_json(new.plan),
                orjson.dumps(list(new.down)),
                str(new.ts_ns),
                new.diagnosis or "",
                HISTORY,
            ],
        )
        if answer == 0:
            error = f"the plan in force is no longer {expected or 'absent'}"
            raise StalePlanError(error)
        if answer == 1:
            self._last = new
        return Saved(stored=answer == 1)

    def history(self) -> list[str]:
        """The ids of the latest plans, newest first."""
        ids = cast("list[bytes]", self._call(self._client.lrange, self._history, 0, -1))
        return [x.decode() for x in ids]

    def _call(self, command: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except redis.RedisError as error:
            message = f"redis failed: {error}".splitlines()[0]
            raise StoreUnavailableError(message) from error

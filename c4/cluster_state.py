"""The cluster state in the configured Redis, for every command that reads or changes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from actions.state.store import RedisState
from c4.inputs import InputError
from schemas.codec import decode_object
from schemas.files import Topology

if TYPE_CHECKING:
    from c4.settings import Settings

# The value of ``--topology`` (``C4_STREAMS_TOPOLOGY``) that reads the fabric from the
# cluster state, the topology ``c4 state load`` put there, instead of a file.
FROM_STATE = "redis"


def open_state(settings: Settings) -> RedisState:
    """The cluster state of the configured Redis and key prefix."""
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    return RedisState.connect(settings.redis_url, password, settings.redis_key_prefix)


def topology_from_state(settings: Settings) -> Topology:
    """The topology last loaded into the cluster state (``c4 state load``), or an
    `InputError` naming the key: the detection worker then checks reported cabling and
    correlates slow paths against the fabric the actions side plans on."""
    state = open_state(settings)
    try:
        raw = state.client.get(state.keys.topology)
    finally:
        state.close()
    if raw is None:
        message = f"redis key {state.keys.topology}: no topology loaded (c4 state load)"
        raise InputError(message)
    try:
        result = decode_object(orjson.loads(raw), "topology")
    except orjson.JSONDecodeError as error:
        message = f"redis key {state.keys.topology}: invalid JSON: {error}"
        raise InputError(message) from None
    if not isinstance(result, Topology):
        reason = getattr(result, "reason", "not a topology document")
        message = f"redis key {state.keys.topology}: {reason}"
        raise InputError(message)
    return result

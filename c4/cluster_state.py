"""The cluster state in the configured Redis, for every command that reads or changes it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actions.state.store import RedisState

if TYPE_CHECKING:
    from c4.settings import Settings


def open_state(settings: Settings) -> RedisState:
    """The cluster state of the configured Redis and key prefix."""
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    return RedisState.connect(settings.redis_url, password, settings.redis_key_prefix)

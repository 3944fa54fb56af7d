"""The Redis plumbing every store shares: a client with short timeouts, errors, text.

Every Redis failure comes out as `StateUnavailable` (the caller retries later; nothing was
committed), so the stores never leak a ``redis`` exception.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import redis

from actions.state import StateUnavailable

P = ParamSpec("P")
R = TypeVar("R")


def connect(url: str, password: str | None = None) -> redis.Redis:
    """A client for a Redis URL, with socket timeouts so an outage is seen quickly."""
    return redis.Redis.from_url(
        url,
        password=password,
        socket_timeout=5,
        socket_connect_timeout=5,
        health_check_interval=10,
    )


@contextmanager
def redis_errors() -> Iterator[None]:
    """Turn a Redis failure into `StateUnavailable` (one line naming the error)."""
    try:
        yield
    except redis.RedisError as error:
        message = f"redis: {type(error).__name__}: {error}"
        raise StateUnavailable(message) from error


def guarded(method: Callable[P, R]) -> Callable[P, R]:
    """A store method whose Redis failures come out as `StateUnavailable`."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with redis_errors():
            return method(*args, **kwargs)

    return wrapper


def text(value: Any) -> str:
    """A Redis reply (bytes or not) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)

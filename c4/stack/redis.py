"""The stack's Redis: redis-server (apt-installed when root and missing), started and probed.

It runs on 127.0.0.1 with its append-only file, log and pid file in
``<stack_dir>/run/redis-<port>/``; a configured password goes in a 0600 config file there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from c4.stack.supervise import HOST, Component, StackError, installed, spawn

if TYPE_CHECKING:
    from c4.settings import Settings

REDIS_READY_TIMEOUT_S = 15.0

_REDIS_HINT = "redis-server not found: run sudo apt-get install -y redis-server"


def redis_component(settings: Settings) -> Component:
    """Redis's run folder and port."""
    return Component(
        "redis",
        settings.stack_dir / "run" / f"redis-{settings.stack_redis_port}",
        ((settings.stack_redis_port, "C4_STACK_REDIS_PORT"),),
    )


def _redis_server() -> str:
    return installed("redis-server", ("redis-server",), _REDIS_HINT)


def _redis_password(settings: Settings) -> str | None:
    return settings.redis_password.get_secret_value() if settings.redis_password else None


def start_redis(settings: Settings, component: Component) -> int:
    """Spawn redis-server on the stack's port (append-only, no snapshots); its pid."""
    server = _redis_server()
    component.run_dir.mkdir(parents=True, exist_ok=True)
    argv = [server]
    auth_file = component.run_dir / "auth.conf"
    password = _redis_password(settings)
    if password is None:
        auth_file.unlink(missing_ok=True)
    else:
        # The password goes in a 0600 config file, never on the command line, which any local
        # user can read in /proc; a config file must be redis-server's first argument.
        escaped = password.replace("\\", "\\\\").replace('"', '\\"')
        descriptor = os.open(auth_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(f'requirepass "{escaped}"\n')
        os.chmod(auth_file, 0o600)
        argv.append(str(auth_file))
    argv += [
        "--bind",
        HOST,
        "--port",
        str(settings.stack_redis_port),
        "--dir",
        str(component.run_dir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--daemonize",
        "no",
    ]
    return spawn(argv, component.log_file, component.pid_file)


def redis_probe(settings: Settings) -> Callable[[float], bool]:
    """A readiness check: True once Redis answers PING; StackError if it rejects the password."""

    def probe(timeout_s: float) -> bool:
        client = redis.Redis(
            host=HOST,
            port=settings.stack_redis_port,
            password=_redis_password(settings),
            socket_timeout=max(0.5, timeout_s),
            socket_connect_timeout=max(0.5, timeout_s),
        )
        try:
            return bool(client.ping())
        except redis.AuthenticationError as error:
            message = (
                f"redis on port {settings.stack_redis_port} rejects C4_REDIS_PASSWORD ({error}):"
                " restart it with c4 stack down && c4 stack up"
            )
            raise StackError(message) from error
        except redis.RedisError:
            return False
        finally:
            client.close()

    return probe

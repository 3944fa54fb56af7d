"""A Kafka broker and a Redis of a test's own, on free ports, for tests that stop or kill them.

Outage tests must never stop the shared stack that every other test (and every other
developer's run) uses. A private stack shares the downloaded jars (same ``stack_dir``) but
has its own ports, run folders, data and pid files; ``stop``/``kill`` act on one component
and ``start`` brings back whatever is down (``stack_up`` reuses what still runs).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

from c4.settings import Settings, load_settings
from c4.stack import port_answers, stack_down, stack_up

Component = Literal["kafka", "redis"]


# Below Linux's ephemeral range (32768-60999), so that no client connection's own port
# collides with a port chosen here.
PORT_RANGE = (20_000, 32_000)


def _free_ports(count: int) -> list[int]:
    rng = random.SystemRandom()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(*PORT_RANGE)
        if port in ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


class PrivateStack:
    """Kafka (KRaft) + Redis on free loopback ports; a context manager that cleans up."""

    def __init__(self, **settings: object) -> None:
        kafka_port, controller_port, redis_port = _free_ports(3)
        base = load_settings()
        self.settings: Settings = base.model_copy(
            update={
                "stack_kafka_port": kafka_port,
                "stack_controller_port": controller_port,
                "stack_redis_port": redis_port,
                "kafka_bootstrap": f"127.0.0.1:{kafka_port}",
                "redis_url": f"redis://127.0.0.1:{redis_port}/0",
                **settings,
            }
        )

    @property
    def bootstrap(self) -> str:
        """The private broker's bootstrap address."""
        return self.settings.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        """The private Redis URL (without password)."""
        return self.settings.redis_url

    def _port(self, component: Component) -> int:
        if component == "kafka":
            return self.settings.stack_kafka_port
        return self.settings.stack_redis_port

    def run_dir(self, component: Component) -> Path:
        """Where ``c4.stack`` keeps the component's pid, log and data."""
        return self.settings.stack_dir / "run" / f"{component}-{self._port(component)}"

    def pid(self, component: Component) -> int:
        """The component's pid as its pid file says."""
        path = self.run_dir(component) / f"{component}.pid"
        return int(path.read_text(encoding="ascii").strip())

    def start(self) -> float:
        """Start whatever is down; return the seconds it took until both answer."""
        began = time.monotonic()
        stack_up(self.settings)
        return time.monotonic() - began

    def stop(self, component: Component, signum: int = signal.SIGKILL) -> None:
        """Stop one component (kill -9 by default) and wait until it is gone."""
        pid = self.pid(component)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if not Path(f"/proc/{pid}").exists() and not port_answers(self._port(component)):
                return
            state = Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[-1]
            if state.split()[0] in {"Z", "X"} and not port_answers(self._port(component)):
                # A zombie leader can still hold its sockets while its other threads exit.
                return
            time.sleep(0.05)
        message = f"{component} (pid {pid}) did not stop"
        raise AssertionError(message)

    def __enter__(self) -> PrivateStack:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack_down(self.settings)
        for component in ("kafka", "redis"):
            shutil.rmtree(self.run_dir(component), ignore_errors=True)

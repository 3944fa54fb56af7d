"""Up, down, status and kill of the whole stack: Kafka and Redis together, in a safe order.

``stack_up`` decides everything (reuse, refuse a taken port) before it starts anything, so a
refusal never leaves half a stack; ``stack_down`` only signals processes that are still ours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from typing import TYPE_CHECKING

from c4.stack.kafka import (
    KAFKA_BUSY_LIMIT_S,
    KAFKA_READY_TIMEOUT_S,
    kafka_component,
    kafka_probe,
    start_kafka,
)
from c4.stack.redis import REDIS_READY_TIMEOUT_S, redis_component, redis_probe, start_redis
from c4.stack.supervise import (
    HOST,
    ComponentStatus,
    Progress,
    StackError,
    alive,
    component_status,
    locked,
    our_pid,
    port_answers,
    send_signal,
    taken_port,
    wait_gone,
    wait_ready,
)

if TYPE_CHECKING:
    from c4.settings import Settings

STOP_TIMEOUT_S = 20.0
KILL_TIMEOUT_S = 5.0


def _check_distinct_ports(settings: Settings) -> None:
    ports = [settings.stack_kafka_port, settings.stack_controller_port, settings.stack_redis_port]
    if len(set(ports)) != len(ports):
        message = (
            "C4_STACK_KAFKA_PORT, C4_STACK_CONTROLLER_PORT and C4_STACK_REDIS_PORT must differ"
            f" (got {ports[0]}, {ports[1]}, {ports[2]})"
        )
        raise StackError(message)


def stack_up(settings: Settings, progress: Progress | None = None) -> list[ComponentStatus]:
    """Start Kafka and Redis unless ours already run; return once both answer.

    Idempotent: a component whose pid file names our live process is reused. A port held by
    anything else is a StackError before anything starts. ``progress`` receives one-line notes
    about slow steps (jar download, storage format, waiting).
    """
    _check_distinct_ports(settings)
    components = [kafka_component(settings), redis_component(settings)]
    probes = {"kafka": kafka_probe(settings), "redis": redis_probe(settings)}
    timeouts = {"kafka": KAFKA_READY_TIMEOUT_S, "redis": REDIS_READY_TIMEOUT_S}
    with contextlib.ExitStack() as locks:
        for component in components:
            locks.enter_context(locked(component.lock_file))
        # Decide everything before starting anything: a taken port must not leave half a stack.
        reused: dict[str, int] = {}
        for component in components:
            pid = our_pid(component)
            if pid is not None:
                reused[component.name] = pid
                continue
            taken = taken_port(component)
            if taken is not None:
                message = (
                    f"port {taken[0]} on {HOST} is taken by another process:"
                    f" stop it or set {taken[1]}"
                )
                raise StackError(message)
        started: dict[str, tuple[int, float]] = {}
        for component in components:
            if component.name in reused:
                continue
            began = time.monotonic()
            if component.name == "kafka":
                pid = start_kafka(settings, component, progress)
            else:
                pid = start_redis(settings, component)
            started[component.name] = (pid, began)
        ready: dict[str, ComponentStatus] = {}
        # Redis first: it answers in milliseconds, so its "started in" is not Kafka's wait.
        for component in reversed(components):
            pid = reused.get(component.name) or started[component.name][0]
            if progress is not None and component.name in started:
                progress(f"{component.name}: waiting for {component.address} (pid {pid})")
            wait_ready(
                component,
                pid,
                probes[component.name],
                timeouts[component.name],
                busy_limit_s=KAFKA_BUSY_LIMIT_S if component.name == "kafka" else None,
            )
            if component.name in reused:
                detail = "already running"
            else:
                elapsed = time.monotonic() - started[component.name][1]
                detail = f"started in {elapsed:.1f} s, log {component.log_file}"
            ready[component.name] = ComponentStatus(
                component.name, "running", pid, component.address, detail
            )
    return [ready[component.name] for component in components]


def stack_down(settings: Settings) -> list[ComponentStatus]:
    """Stop the Kafka and Redis that ``stack_up`` started (by pid file); idempotent."""
    components = [kafka_component(settings), redis_component(settings)]
    statuses = []
    with contextlib.ExitStack() as locks:
        for component in components:
            if component.run_dir.is_dir():
                locks.enter_context(locked(component.lock_file))
        # SIGTERM to both first, then wait: the two shut down in parallel.
        stopping: dict[str, tuple[int, float]] = {}
        for component in components:
            pid = our_pid(component)
            if pid is not None:
                stopping[component.name] = (pid, time.monotonic())
                send_signal(component, pid, signal.SIGTERM)
        for component in components:
            if component.name not in stopping:
                had_pid_file = component.pid_file.exists()
                component.pid_file.unlink(missing_ok=True)
                state = component_status(component)
                if state.state == "foreign":
                    detail = f"{state.detail}; not ours, left alone"
                    statuses.append(dataclasses.replace(state, detail=detail))
                    continue
                detail = "stale pid file removed" if had_pid_file else "not running"
                statuses.append(
                    ComponentStatus(component.name, "stopped", None, component.address, detail)
                )
                continue
            pid, began = stopping[component.name]
            how = "SIGTERM"
            if not wait_gone(pid, STOP_TIMEOUT_S):
                how = "SIGKILL"
                send_signal(component, pid, signal.SIGKILL)
                if not wait_gone(pid, KILL_TIMEOUT_S):
                    message = f"{component.name} pid {pid} survived SIGKILL: kill it by hand"
                    raise StackError(message)
            component.pid_file.unlink(missing_ok=True)
            detail = f"stopped pid {pid} ({how}, {time.monotonic() - began:.1f} s)"
            statuses.append(
                ComponentStatus(component.name, "stopped", None, component.address, detail)
            )
    return statuses


def stack_kill(settings: Settings, name: str) -> int:
    """kill -9 the Kafka or Redis that ``stack_up`` started (a crash, for fault tests);
    wait until it is gone and its port is free; its pid. ``stack_up`` starts it again."""
    components = {c.name: c for c in (kafka_component(settings), redis_component(settings))}
    component = components.get(name)
    if component is None:
        message = f"no stack component {name!r} (kafka or redis)"
        raise StackError(message)
    pid = our_pid(component)
    if pid is None:
        message = f"{name} at {component.address} was not started by `c4 stack up`: not killed"
        raise StackError(message)
    send_signal(component, pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while alive(pid) or port_answers(component.port):
        if time.monotonic() >= deadline:
            message = f"{name} pid {pid} survived SIGKILL: kill it by hand"
            raise StackError(message)
        time.sleep(0.05)
    return pid


def stack_status(settings: Settings) -> list[ComponentStatus]:
    """What runs on the stack's ports: ours, stale pid file, another process, or nothing."""
    return [
        component_status(kafka_component(settings)),
        component_status(redis_component(settings)),
    ]

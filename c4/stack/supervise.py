"""Supervision of the stack's detached processes: pid files, spawning, locks, readiness.

Each component (Kafka, Redis) runs detached on 127.0.0.1 with its data, log and pid file in a
run folder of its own. Only a process whose pid file we wrote and whose command line is still
the one we started is ever signalled: pids get reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from c4 import C4Error

HOST = "127.0.0.1"
LOG_LINE_MAX = 400
APT_TIMEOUT_S = 600.0
_STACK_FRAME = re.compile(r"^(at [\w$.<>/]+\(.*\)|\.\.\. \d+ more)$")

State = Literal["running", "stopped", "stale", "foreign"]
Progress = Callable[[str], None]


class StackError(C4Error):
    """The local stack could not be started, stopped or inspected."""


@dataclass(frozen=True, slots=True)
class ComponentStatus:
    """One component of the local stack as ``up``, ``down`` or ``status`` found it."""

    name: str
    state: State
    pid: int | None
    address: str
    detail: str


@dataclass(frozen=True, slots=True)
class Component:
    """Where one component keeps its runtime files and which ports it binds."""

    name: str
    run_dir: Path
    # (port, setting that moves it); the first one is the client address.
    ports: tuple[tuple[int, str], ...]

    @property
    def port(self) -> int:
        return self.ports[0][0]

    @property
    def address(self) -> str:
        # A component that binds no port (munged: a Unix socket) is known by its folder.
        return f"{HOST}:{self.port}" if self.ports else str(self.run_dir)

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    @property
    def lock_file(self) -> Path:
        return self.run_dir / ".lock"


# --- which process is ours ---------------------------------------------------------------------


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _reap(pid: int) -> None:
    """Collect the exit status of a child of ours, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped by anyone) counts as gone."""
    _reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    # The state field follows the command name, which may itself contain ')' and spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in {"Z", "X"}


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip()


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _is_ours(component: Component, pid: int) -> bool:
    """Whether ``pid`` is still the process we started for ``component`` (pids get reused)."""
    if pid <= 0 or not alive(pid):
        return False
    command = _cmdline(pid)
    foreground = ("slurm", "munged", "etcd", "kube-", "alertmanager", "prometheus")
    if component.name.startswith(foreground):
        # Slurm's daemons, munged, etcd, kube-apiserver, Alertmanager and Prometheus run in
        # the foreground with every path under our folder.
        return f"{component.run_dir}/" in command
    if component.name == "kafka":
        return "kafka.Kafka" in command and str(component.run_dir / "server.properties") in command
    if "redis-server" not in command:
        return False
    # Redis rewrites its command line to "redis-server 127.0.0.1:<port>" right after start,
    # but it chdirs into --dir first, so the run folder identifies it either way.
    if f"--dir {component.run_dir}" in command:
        return True
    cwd = _cwd(pid)
    return cwd is not None and cwd.resolve() == component.run_dir.resolve()


def our_pid(component: Component) -> int | None:
    """The pid in ``component``'s pid file, if that process is still the one we started."""
    pid = _read_pid(component.pid_file)
    return pid if pid is not None and _is_ours(component, pid) else None


def port_answers(port: int, host: str = HOST, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def taken_port(component: Component) -> tuple[int, str] | None:
    """The first of ``component``'s ports that something answers on, with its setting."""
    for port, setting in component.ports:
        if port_answers(port):
            return port, setting
    return None


def component_status(component: Component) -> ComponentStatus:
    """What runs on ``component``'s ports: ours, stale pid file, another process, or nothing."""
    pid = _read_pid(component.pid_file)
    if pid is not None and _is_ours(component, pid):
        return ComponentStatus(
            component.name, "running", pid, component.address, f"log {component.log_file}"
        )
    taken = taken_port(component)
    if taken is not None:
        detail = f"port {taken[0]} on {HOST} is taken by another process"
        return ComponentStatus(component.name, "foreign", None, component.address, detail)
    if component.pid_file.exists():
        detail = f"pid file {component.pid_file} names a process that is gone"
        return ComponentStatus(component.name, "stale", pid, component.address, detail)
    return ComponentStatus(component.name, "stopped", None, component.address, "not running")


# --- logs, tools and spawning ------------------------------------------------------------------


def last_line(path: Path) -> str:
    """The log's last line that says something (stack frames skipped), shortened."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    # A JVM that dies logs a stack trace last; its frames ("at ...", "... 3 more") say nothing,
    # the line above them (the exception, or its last "Caused by:") names the problem.
    lines = [
        line.strip()
        for line in tail.splitlines()
        if line.strip() and not _STACK_FRAME.match(line.strip())
    ]
    if not lines:
        return "(empty log)"
    last = lines[-1]
    return last if len(last) <= LOG_LINE_MAX else last[: LOG_LINE_MAX - 3] + "..."


def _rotate(log_file: Path) -> None:
    """Keep the previous run's log as ``<name>.log.1``: the new log then describes this run."""
    if log_file.exists():
        log_file.replace(log_file.with_name(log_file.name + ".1"))


def spawn(argv: list[str], log_file: Path, pid_file: Path) -> int:
    """Start ``argv`` detached (own session, stdin /dev/null, output to ``log_file``).

    posix_spawn rather than subprocess.Popen: the child must outlive us, and a Popen object
    dropped while its process runs raises ResourceWarning (an error under ``-W error``).
    """
    _rotate(log_file)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    # argv[0] is an absolute path from shutil.which and the arguments are ours: no shell.
    pid = os.posix_spawn(argv[0], argv, dict(os.environ), file_actions=actions, setsid=True)
    temporary = pid_file.with_name(pid_file.name + ".tmp")
    temporary.write_text(f"{pid}\n", encoding="ascii")
    temporary.replace(pid_file)
    return pid


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Serialise concurrent ``up``/``down`` on one folder (two terminals, parallel test runs)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def require(program: str, hint: str) -> str:
    """The path of ``program`` on PATH; StackError with ``hint`` (how to install it) if none."""
    found = shutil.which(program)
    if found is None:
        raise StackError(hint)
    return found


def installed(program: str, packages: tuple[str, ...], hint: str) -> str:
    """The path of ``program``; installed from Debian's ``packages`` first when missing and
    root (the test and demo scripts rely on it), else StackError with ``hint``."""
    found = shutil.which(program)
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise StackError(hint)
    apt = require("apt-get", hint)
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([apt, "update"], [apt, "install", "-y", *packages]):
        result = subprocess.run(  # noqa: S603 - fixed argv, root only, no shell
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=environment,
            timeout=APT_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines() or ["(no output)"]
            message = f"{' '.join(argv[1:])} failed ({lines[-1]}): {hint}"
            raise StackError(message)
    return require(program, hint)


def run_tool(argv: list[str], log_file: Path, timeout_s: float, what: str) -> None:
    """Run a short-lived tool, its output kept in ``log_file``; StackError naming the log."""
    try:
        result = subprocess.run(  # noqa: S603 - fixed argv built here, no shell
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        partial = [part for part in (error.stdout, error.stderr) if part]
        log_file.write_text(
            "".join(
                part if isinstance(part, str) else part.decode(errors="replace") for part in partial
            ),
            encoding="utf-8",
        )
        message = f"{what} did not finish within {timeout_s:.0f} s (log {log_file})"
        raise StackError(message) from error
    log_file.write_text(result.stdout + result.stderr, encoding="utf-8")
    if result.returncode != 0:
        message = f"{what} failed: {last_line(log_file)} (log {log_file})"
        raise StackError(message)


# --- waiting -----------------------------------------------------------------------------------


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def wait_ready(
    component: Component,
    pid: int,
    probe: Callable[[float], bool],
    timeout_s: float,
    busy_limit_s: float | None = None,
) -> None:
    """Return once ``probe`` answers; StackError (with the log's last line) if ``pid`` exits
    first or ``timeout_s`` passes.

    With ``busy_limit_s``, ``timeout_s`` counts only the time in which the component's log did
    not grow: a broker recovering thousands of partitions after an unclean stop logs a line per
    partition for minutes and then answers, and killing it then would only start it over. It
    still gives up after ``busy_limit_s`` in all.
    """
    began = time.monotonic()
    quiet_since = began
    logged = _log_size(component.log_file)
    while True:
        if not alive(pid):
            message = (
                f"{component.name} exited while starting: {last_line(component.log_file)}"
                f" (log {component.log_file})"
            )
            raise StackError(message)
        now = time.monotonic()
        if busy_limit_s is not None:
            size = _log_size(component.log_file)
            if size != logged:
                logged, quiet_since = size, now
        deadline = quiet_since + timeout_s
        if busy_limit_s is not None:
            deadline = min(deadline, began + busy_limit_s)
        if probe(min(5.0, max(0.5, deadline - now))):
            return
        if time.monotonic() >= deadline:
            waited = time.monotonic() - began
            quiet = (
                ""
                if busy_limit_s is None
                else f" ({time.monotonic() - quiet_since:.0f} s without a log line)"
            )
            message = (
                f"{component.name} did not answer on {component.address} within"
                f" {waited:.0f} s{quiet}: {last_line(component.log_file)}"
                f" (log {component.log_file})"
            )
            raise StackError(message)
        time.sleep(0.2)


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` ended within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def send_signal(component: Component, pid: int, signum: signal.Signals) -> None:
    """Signal ``pid`` if it is still ``component``'s process; gone already is fine."""
    # Checked again right before each signal: the pid may have been recycled meanwhile.
    if _is_ours(component, pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def stop_pid(
    component: Component, pid: int, timeout_s: float, first: signal.Signals = signal.SIGTERM
) -> ComponentStatus:
    """Stop one of our processes (``first``, then SIGKILL after ``timeout_s``), wait until its
    ports are free, remove its pid file; its status now. The caller holds the lock."""
    began = time.monotonic()
    for signum in (first, signal.SIGKILL):
        send_signal(component, pid, signum)
        if wait_gone(pid, timeout_s):
            break
    else:
        message = f"{component.name} pid {pid} survived SIGKILL: kill it by hand"
        raise StackError(message)
    # An exited main thread reads as gone while the process's last threads still hold its ports.
    deadline = time.monotonic() + timeout_s
    while taken_port(component) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    component.pid_file.unlink(missing_ok=True)
    detail = f"stopped pid {pid} ({time.monotonic() - began:.1f} s)"
    return ComponentStatus(component.name, "stopped", None, component.address, detail)


def stop_ours(component: Component, timeout_s: float) -> ComponentStatus:
    """Stop the process our pid file names (`stop_pid`); idempotent: a component not running
    (or never started) is reported as it is."""
    if not component.run_dir.is_dir():
        return component_status(component)
    with locked(component.lock_file):
        pid = our_pid(component)
        if pid is None:
            component.pid_file.unlink(missing_ok=True)
            return component_status(component)
        return stop_pid(component, pid, timeout_s)

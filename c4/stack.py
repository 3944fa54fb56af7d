"""``c4 stack``: the local stack, a KRaft Kafka broker (jars from Maven Central) and Redis.

Both run detached on 127.0.0.1 with their data, log and pid file in a run folder per port,
``<stack_dir>/run/kafka-<port>/`` and ``<stack_dir>/run/redis-<port>/``; the Kafka jars live in
``<stack_dir>/kafka-<version>/lib`` and are shared by every port. ``stack_down`` only signals a
process whose pid file we wrote and whose command line is still the one we started.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from c4 import C4Error

if TYPE_CHECKING:
    from c4.settings import Settings

HOST = "127.0.0.1"
# Kafka 4.1 declares slf4j-api 1.7.36, which cannot see an slf4j 2 provider: without pinning the
# API to 2.x as well the broker logs nothing at all (NOP logger), and a failed start is mute.
SLF4J_VERSION = "2.0.17"
KAFKA_READY_TIMEOUT_S = 90.0
REDIS_READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 20.0
KILL_TIMEOUT_S = 5.0
MAVEN_TIMEOUT_S = 900.0
FORMAT_TIMEOUT_S = 120.0
APT_TIMEOUT_S = 600.0
LOG_LINE_MAX = 400
_STACK_FRAME = re.compile(r"^(at [\w$.<>/]+\(.*\)|\.\.\. \d+ more)$")

State = Literal["running", "stopped", "stale", "foreign"]
Progress = Callable[[str], None]

_JAVA_HINT = "java not found: install OpenJDK 17+ (apt-get install -y openjdk-17-jre-headless)"
_MVN_HINT = "mvn not found: install Maven 3.8+ (apt-get install -y maven)"
_REDIS_HINT = "redis-server not found: run sudo apt-get install -y redis-server"


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
class _Component:
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
        return f"{HOST}:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    @property
    def lock_file(self) -> Path:
        return self.run_dir / ".lock"


def _kafka(settings: Settings) -> _Component:
    return _Component(
        "kafka",
        settings.stack_dir / "run" / f"kafka-{settings.stack_kafka_port}",
        (
            (settings.stack_kafka_port, "C4_STACK_KAFKA_PORT"),
            (settings.stack_controller_port, "C4_STACK_CONTROLLER_PORT"),
        ),
    )


def _redis(settings: Settings) -> _Component:
    return _Component(
        "redis",
        settings.stack_dir / "run" / f"redis-{settings.stack_redis_port}",
        ((settings.stack_redis_port, "C4_STACK_REDIS_PORT"),),
    )


def kafka_home(settings: Settings) -> Path:
    """The folder holding the pom, the jars (``lib/``) and the mvn log of one Kafka version."""
    return settings.stack_dir / f"kafka-{settings.stack_kafka_version}"


def kafka_properties_path(settings: Settings) -> Path:
    """The broker's server.properties, in the run folder of its port."""
    return _kafka(settings).run_dir / "server.properties"


# --- rendering ---------------------------------------------------------------------------------


def render_pom(kafka_version: str) -> str:
    """A pom whose runtime dependencies are exactly the broker's classpath."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>c4</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{kafka_version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka_version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>{SLF4J_VERSION}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>{SLF4J_VERSION}</version>
    </dependency>
  </dependencies>
</project>
"""


def stack_serves_sasl(settings: Settings) -> bool:
    """Whether the local broker's client listener requires SASL/PLAIN (C4_KAFKA_* say so).

    With ``C4_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT`` the stack serves what the clients are
    configured for: one SASL_PLAINTEXT listener whose only user is the configured username
    and password (PLAIN). TLS is not served locally (StackError): use a real cluster for it.
    """
    protocol = settings.kafka_security_protocol
    if protocol in ("SSL", "SASL_SSL"):
        message = (
            f"the local stack serves PLAINTEXT or SASL_PLAINTEXT, not {protocol}:"
            " point C4_KAFKA_BOOTSTRAP at a TLS broker instead of running c4 stack up"
        )
        raise StackError(message)
    if protocol != "SASL_PLAINTEXT":
        return False
    username, password = settings.kafka_sasl_username, settings.kafka_sasl_password
    if settings.kafka_sasl_mechanism != "PLAIN" or not username or password is None:
        message = (
            "a SASL_PLAINTEXT local stack needs C4_KAFKA_SASL_MECHANISM=PLAIN,"
            " C4_KAFKA_SASL_USERNAME and C4_KAFKA_SASL_PASSWORD"
        )
        raise StackError(message)
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", username):
        message = "C4_KAFKA_SASL_USERNAME of the local stack: letters, digits, '_', '-'"
        raise StackError(message)
    return True


def _properties_escaped(text: str) -> str:
    """A value as java.util.Properties reads it back: backslashes doubled, non-ASCII as \\u."""
    out = []
    for char in text.replace("\\", "\\\\"):
        if " " <= char <= "~":
            out.append(char)
        else:
            data = char.encode("utf-16-be", "surrogatepass")
            out += [f"\\u{data[i] << 8 | data[i + 1]:04x}" for i in range(0, len(data), 2)]
    return "".join(out)


def _plain_jaas(username: str, password: str) -> str:
    """The PLAIN login module: the broker's own identity, which is also its only user."""
    quoted = '"' + password.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return (
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
        f' username="{username}" password={quoted} user_{username}={quoted};'
    )


def render_server_properties(settings: Settings, data_dir: Path) -> str:
    """server.properties of a single-node KRaft broker+controller on 127.0.0.1."""
    port = settings.stack_kafka_port
    controller = settings.stack_controller_port
    client = "SASL_PLAINTEXT" if stack_serves_sasl(settings) else "PLAINTEXT"
    entries = {
        "process.roles": "broker,controller",
        "node.id": "1",
        # Dynamic quorum (KIP-853): formatted with --standalone, no static voter list.
        "controller.quorum.bootstrap.servers": f"{HOST}:{controller}",
        "listeners": f"{client}://{HOST}:{port},CONTROLLER://{HOST}:{controller}",
        "advertised.listeners": f"{client}://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": client,
        "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{client}:{client}",
        "log.dirs": str(data_dir),
        # One broker: every internal topic must accept a single replica.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "min.insync.replicas": "1",
        "default.replication.factor": "1",
        # Tests start consumer groups constantly; the default 3 s delay is pure waiting.
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "num.partitions": "8",
    }
    if client == "SASL_PLAINTEXT":
        username = settings.kafka_sasl_username or ""
        password = settings.kafka_sasl_password
        secret = password.get_secret_value() if password is not None else ""
        entries |= {
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": _properties_escaped(
                _plain_jaas(username, secret)
            ),
        }
    lines = ["# Written by c4 stack up; rewritten on every start.", ""]
    lines += [f"{key}={value}" for key, value in entries.items()]
    return "\n".join(lines) + "\n"


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID, base64url without padding, as StorageTool makes it.

    Generated here rather than by ``StorageTool random-uuid`` to save one JVM start (~1 s);
    like Kafka's ``Uuid.randomUuid`` it never starts with '-', which a CLI would read as an option.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


# --- processes ---------------------------------------------------------------------------------


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _reap(pid: int) -> None:
    """Collect the exit status of a child of ours, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _alive(pid: int) -> bool:
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


def _is_ours(component: _Component, pid: int) -> bool:
    """Whether ``pid`` is still the process we started for ``component`` (pids get reused)."""
    if pid <= 0 or not _alive(pid):
        return False
    command = _cmdline(pid)
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


def _our_pid(component: _Component) -> int | None:
    pid = _read_pid(component.pid_file)
    return pid if pid is not None and _is_ours(component, pid) else None


def port_answers(port: int, host: str = HOST, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _taken_port(component: _Component) -> tuple[int, str] | None:
    for port, setting in component.ports:
        if port_answers(port):
            return port, setting
    return None


def _last_line(path: Path) -> str:
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


def _spawn(argv: list[str], log_file: Path, pid_file: Path) -> int:
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
def _locked(lock_file: Path) -> Iterator[None]:
    """Serialise concurrent ``up``/``down`` on one folder (two terminals, parallel test runs)."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _require(program: str, hint: str) -> str:
    found = shutil.which(program)
    if found is None:
        raise StackError(hint)
    return found


def _run_tool(argv: list[str], log_file: Path, timeout_s: float, what: str) -> None:
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
        message = f"{what} failed: {_last_line(log_file)} (log {log_file})"
        raise StackError(message)


# --- Kafka -------------------------------------------------------------------------------------


def ensure_kafka_jars(settings: Settings, progress: Progress | None = None) -> Path:
    """The broker's ``lib/`` folder, resolved from Maven Central by mvn the first time."""
    home = kafka_home(settings)
    lib = home / "lib"
    marker = home / "lib.complete"
    pom = render_pom(settings.stack_kafka_version)
    # The marker holds the pom's digest: a changed pom (another slf4j) resolves again.
    digest = hashlib.sha256(pom.encode()).hexdigest()

    def complete() -> bool:
        with contextlib.suppress(OSError):
            return marker.read_text(encoding="ascii").strip() == digest and lib.is_dir()
        return False

    if complete():
        return lib
    _require("java", _JAVA_HINT)
    mvn = _require("mvn", _MVN_HINT)
    with _locked(home / ".lock"):
        if complete():  # another process resolved it while we waited for the lock
            return lib
        if progress is not None:
            progress(f"kafka: resolving Kafka {settings.stack_kafka_version} jars with mvn")
        (home / "pom.xml").write_text(pom, encoding="utf-8")
        # Resolve into a scratch folder: a failed or interrupted run never leaves a lib/ that
        # looks complete, and a re-resolve never mixes old and new jars on one classpath.
        partial = home / "lib.partial"
        shutil.rmtree(partial, ignore_errors=True)
        _run_tool(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(home / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={partial}",
                "-DincludeScope=runtime",
            ],
            home / "mvn.log",
            MAVEN_TIMEOUT_S,
            "mvn (check network access to Maven Central and the version C4_STACK_KAFKA_VERSION)",
        )
        broker_jar = partial / f"kafka_2.13-{settings.stack_kafka_version}.jar"
        if not broker_jar.is_file():
            message = f"mvn finished but {broker_jar.name} is missing: see {home / 'mvn.log'}"
            raise StackError(message)
        shutil.rmtree(lib, ignore_errors=True)
        partial.rename(lib)
        marker.write_text(digest + "\n", encoding="ascii")
    return lib


def _format_storage(
    settings: Settings, java: str, lib: Path, component: _Component, progress: Progress | None
) -> None:
    data_dir = component.run_dir / "data"
    if (data_dir / "meta.properties").exists():
        return
    if progress is not None:
        progress(f"kafka: formatting storage in {data_dir}")
    _run_tool(
        [
            java,
            "-cp",
            f"{lib}/*",
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            new_cluster_id(),
            "-c",
            str(kafka_properties_path(settings)),
        ],
        component.run_dir / "format.log",
        FORMAT_TIMEOUT_S,
        "kafka storage format",
    )


def _start_kafka(settings: Settings, component: _Component, progress: Progress | None) -> int:
    lib = ensure_kafka_jars(settings, progress)
    java = _require("java", _JAVA_HINT)
    component.run_dir.mkdir(parents=True, exist_ok=True)
    properties = kafka_properties_path(settings)
    # 0600: with SASL it holds the password (the command line names only the file).
    descriptor = os.open(properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(render_server_properties(settings, component.run_dir / "data"))
    os.chmod(properties, 0o600)
    _format_storage(settings, java, lib, component, progress)
    argv = [
        java,
        f"-Xmx{settings.stack_kafka_heap_mb}m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        # A JVM crash report would otherwise land in whatever folder `c4 stack up` ran from.
        f"-XX:ErrorFile={component.run_dir}/hs_err_pid%p.log",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSSZ",
        "-cp",
        f"{lib}/*",
        "kafka.Kafka",
        str(properties),
    ]
    return _spawn(argv, component.log_file, component.pid_file)


def _stack_admin_config(settings: Settings) -> dict[str, str | int | float | bool]:
    """Client config for the stack's own broker: its port, SASL only when it serves SASL."""
    sasl = stack_serves_sasl(settings)
    config: dict[str, str | int | float | bool] = {
        key: value
        for key, value in settings.kafka_client_config().items()
        if not key.startswith("ssl.") and (sasl or not key.startswith("sasl."))
    }
    config["bootstrap.servers"] = f"{HOST}:{settings.stack_kafka_port}"
    config["security.protocol"] = "SASL_PLAINTEXT" if sasl else "PLAINTEXT"
    # Critical only: a broker still starting up is expected, not worth librdkafka's stderr.
    config["log_level"] = 2
    return config


def _kafka_probe(settings: Settings) -> Callable[[float], bool]:
    admin: list[AdminClient] = []

    def probe(timeout_s: float) -> bool:
        # Only build the client once the port accepts: librdkafka logs every refused connect.
        if not admin:
            if not port_answers(settings.stack_kafka_port):
                return False
            admin.append(AdminClient(_stack_admin_config(settings)))
        try:
            metadata = admin[0].list_topics(timeout=max(0.5, timeout_s))
        except KafkaException:
            return False
        return bool(metadata.brokers)

    return probe


# --- Redis -------------------------------------------------------------------------------------


def _redis_server() -> str:
    found = shutil.which("redis-server")
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise StackError(_REDIS_HINT)
    apt = _require("apt-get", _REDIS_HINT)
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in ([apt, "update"], [apt, "install", "-y", "redis-server"]):
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
            message = f"{' '.join(argv[1:])} failed ({lines[-1]}): install redis-server by hand"
            raise StackError(message)
    found = shutil.which("redis-server")
    if found is None:
        raise StackError(_REDIS_HINT)
    return found


def _redis_password(settings: Settings) -> str | None:
    return settings.redis_password.get_secret_value() if settings.redis_password else None


def _start_redis(settings: Settings, component: _Component) -> int:
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
    return _spawn(argv, component.log_file, component.pid_file)


def _redis_probe(settings: Settings) -> Callable[[float], bool]:
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


# --- up / down / status ------------------------------------------------------------------------


def _wait_ready(
    component: _Component, pid: int, probe: Callable[[float], bool], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if not _alive(pid):
            message = (
                f"{component.name} exited while starting: {_last_line(component.log_file)}"
                f" (log {component.log_file})"
            )
            raise StackError(message)
        remaining = deadline - time.monotonic()
        if probe(min(5.0, max(0.5, remaining))):
            return
        if time.monotonic() >= deadline:
            message = (
                f"{component.name} did not answer on {component.address} within"
                f" {timeout_s:.0f} s: {_last_line(component.log_file)} (log {component.log_file})"
            )
            raise StackError(message)
        time.sleep(0.2)


def _status(component: _Component) -> ComponentStatus:
    pid = _read_pid(component.pid_file)
    if pid is not None and _is_ours(component, pid):
        return ComponentStatus(
            component.name, "running", pid, component.address, f"log {component.log_file}"
        )
    taken = _taken_port(component)
    if taken is not None:
        detail = f"port {taken[0]} on {HOST} is taken by another process"
        return ComponentStatus(component.name, "foreign", None, component.address, detail)
    if component.pid_file.exists():
        detail = f"pid file {component.pid_file} names a process that is gone"
        return ComponentStatus(component.name, "stale", pid, component.address, detail)
    return ComponentStatus(component.name, "stopped", None, component.address, "not running")


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
    components = [_kafka(settings), _redis(settings)]
    probes = {"kafka": _kafka_probe(settings), "redis": _redis_probe(settings)}
    timeouts = {"kafka": KAFKA_READY_TIMEOUT_S, "redis": REDIS_READY_TIMEOUT_S}
    with contextlib.ExitStack() as locks:
        for component in components:
            locks.enter_context(_locked(component.lock_file))
        # Decide everything before starting anything: a taken port must not leave half a stack.
        reused: dict[str, int] = {}
        for component in components:
            pid = _our_pid(component)
            if pid is not None:
                reused[component.name] = pid
                continue
            taken = _taken_port(component)
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
                pid = _start_kafka(settings, component, progress)
            else:
                pid = _start_redis(settings, component)
            started[component.name] = (pid, began)
        ready: dict[str, ComponentStatus] = {}
        # Redis first: it answers in milliseconds, so its "started in" is not Kafka's wait.
        for component in reversed(components):
            pid = reused.get(component.name) or started[component.name][0]
            if progress is not None and component.name in started:
                progress(f"{component.name}: waiting for {component.address} (pid {pid})")
            _wait_ready(component, pid, probes[component.name], timeouts[component.name])
            if component.name in reused:
                detail = "already running"
            else:
                elapsed = time.monotonic() - started[component.name][1]
                detail = f"started in {elapsed:.1f} s, log {component.log_file}"
            ready[component.name] = ComponentStatus(
                component.name, "running", pid, component.address, detail
            )
    return [ready[component.name] for component in components]


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _signal(component: _Component, pid: int, signum: signal.Signals) -> None:
    # Checked again right before each signal: the pid may have been recycled meanwhile.
    if _is_ours(component, pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def stack_down(settings: Settings) -> list[ComponentStatus]:
    """Stop the Kafka and Redis that ``stack_up`` started (by pid file); idempotent."""
    components = [_kafka(settings), _redis(settings)]
    statuses = []
    with contextlib.ExitStack() as locks:
        for component in components:
            if component.run_dir.is_dir():
                locks.enter_context(_locked(component.lock_file))
        # SIGTERM to both first, then wait: the two shut down in parallel.
        stopping: dict[str, tuple[int, float]] = {}
        for component in components:
            pid = _our_pid(component)
            if pid is not None:
                stopping[component.name] = (pid, time.monotonic())
                _signal(component, pid, signal.SIGTERM)
        for component in components:
            if component.name not in stopping:
                had_pid_file = component.pid_file.exists()
                component.pid_file.unlink(missing_ok=True)
                state = _status(component)
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
            if not _wait_gone(pid, STOP_TIMEOUT_S):
                how = "SIGKILL"
                _signal(component, pid, signal.SIGKILL)
                if not _wait_gone(pid, KILL_TIMEOUT_S):
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
    components = {c.name: c for c in (_kafka(settings), _redis(settings))}
    component = components.get(name)
    if component is None:
        message = f"no stack component {name!r} (kafka or redis)"
        raise StackError(message)
    pid = _our_pid(component)
    if pid is None:
        message = f"{name} at {component.address} was not started by `c4 stack up`: not killed"
        raise StackError(message)
    _signal(component, pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while _alive(pid) or port_answers(component.port):
        if time.monotonic() >= deadline:
            message = f"{name} pid {pid} survived SIGKILL: kill it by hand"
            raise StackError(message)
        time.sleep(0.05)
    return pid


def stack_status(settings: Settings) -> list[ComponentStatus]:
    """What runs on the stack's ports: ours, stale pid file, another process, or nothing."""
    return [_status(_kafka(settings)), _status(_redis(settings))]


# --- command line ------------------------------------------------------------------------------


def format_status(status: ComponentStatus) -> str:
    """One human line per component."""
    pid = f"pid {status.pid}" if status.pid is not None else "-"
    return f"{status.name:<6} {status.state:<8} {status.address:<16} {pid:<10} {status.detail}"


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "up":
        began = time.monotonic()
        statuses = stack_up(settings, progress=_progress)
        for status in statuses:
            print(format_status(status))
        print(f"stack up in {time.monotonic() - began:.1f} s")
        return 0
    if args.action == "down":
        for status in stack_down(settings):
            print(format_status(status))
        return 0
    for status in stack_status(settings):
        if args.json:
            print(json.dumps(dataclasses.asdict(status), sort_keys=True))
        else:
            print(format_status(status))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stack up|down|status [--json]`` subcommand."""
    parser = subparsers.add_parser(
        "stack", help="start, stop or inspect the local Kafka (KRaft) and Redis"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("up", help="start Kafka and Redis (reuses ours when they already run)")
    actions.add_parser("down", help="stop the Kafka and Redis that up started")
    status = actions.add_parser("status", help="what runs on the stack's ports")
    status.add_argument("--json", action="store_true", help="one JSON object per component")
    parser.set_defaults(handler=_run, json=False)

"""The stack's single-node KRaft broker: server.properties (SASL/PLAIN too), format, start, probe.

The broker and its controller run in one JVM on 127.0.0.1; its data, log, properties and pid
file live in ``<stack_dir>/run/kafka-<port>/``, its jars come from `c4.stack.maven`.
"""

from __future__ import annotations

import base64
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from c4.stack.maven import JAVA_HINT, ensure_kafka_jars
from c4.stack.supervise import (
    HOST,
    Component,
    Progress,
    StackError,
    port_answers,
    require,
    run_tool,
    spawn,
)

if TYPE_CHECKING:
    from c4.settings import Settings

KAFKA_READY_TIMEOUT_S = 90.0
# A broker that keeps logging (recovering its partitions' logs) is given up to this long.
KAFKA_BUSY_LIMIT_S = 1800.0
FORMAT_TIMEOUT_S = 120.0


def kafka_component(settings: Settings) -> Component:
    """The broker's run folder and ports (client listener first, then the controller)."""
    return Component(
        "kafka",
        settings.stack_dir / "run" / f"kafka-{settings.stack_kafka_port}",
        (
            (settings.stack_kafka_port, "C4_STACK_KAFKA_PORT"),
            (settings.stack_controller_port, "C4_STACK_CONTROLLER_PORT"),
        ),
    )


def kafka_properties_path(settings: Settings) -> Path:
    """The broker's server.properties, in the run folder of its port."""
    return kafka_component(settings).run_dir / "server.properties"


# --- rendering ---------------------------------------------------------------------------------


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


# --- starting and probing ----------------------------------------------------------------------


def _format_storage(
    settings: Settings, java: str, lib: Path, component: Component, progress: Progress | None
) -> None:
    data_dir = component.run_dir / "data"
    if (data_dir / "meta.properties").exists():
        return
    if progress is not None:
        progress(f"kafka: formatting storage in {data_dir}")
    run_tool(
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


def start_kafka(settings: Settings, component: Component, progress: Progress | None) -> int:
    """Write server.properties, format the storage once, spawn the broker; its pid."""
    lib = ensure_kafka_jars(settings, progress)
    java = require("java", JAVA_HINT)
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
    return spawn(argv, component.log_file, component.pid_file)


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


def kafka_probe(settings: Settings) -> Callable[[float], bool]:
    """A readiness check: True once the broker answers a metadata request with a broker."""
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

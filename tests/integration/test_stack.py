"""The real local stack on free ports in a scratch folder: up, reuse, topics, refusal, down.

The Kafka jars are not downloaded again: the scratch stack dir links ``kafka-<version>`` to the
default one (resolved there first if needed), while data, logs and pid files stay scratch.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from pydantic import SecretStr

from c4.settings import Settings
from c4.stack import (
    ComponentStatus,
    StackError,
    ensure_kafka_jars,
    kafka_home,
    stack_down,
    stack_status,
    stack_up,
)
from c4.topics import create_topics
from schemas.topics import ALL_TOPICS

pytestmark = pytest.mark.integration

# Quotes and a backslash: the auth.conf escaping must round-trip them.
PASSWORD = 's3cret "quoted" \\ pass'  # noqa: S105 - a throwaway test value


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in {"Z", "X"}


def by_name(statuses: list[ComponentStatus]) -> dict[str, ComponentStatus]:
    return {status.name: status for status in statuses}


@pytest.fixture(scope="module")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    default = Settings()
    ensure_kafka_jars(default)
    scratch = tmp_path_factory.mktemp("stack")
    (scratch / kafka_home(default).name).symlink_to(kafka_home(default), target_is_directory=True)
    return scratch


def scratch_settings(stack_dir: Path, **overrides: object) -> Settings:
    kafka, controller, redis_port = free_ports(3)
    values: dict[str, object] = {
        "stack_dir": stack_dir,
        "stack_kafka_port": kafka,
        "stack_controller_port": controller,
        "stack_redis_port": redis_port,
        "kafka_bootstrap": f"127.0.0.1:{kafka}",
        "redis_url": f"redis://127.0.0.1:{redis_port}/0",
        **overrides,
    }
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def running(stack_dir: Path) -> Iterator[tuple[Settings, dict[str, ComponentStatus]]]:
    settings = scratch_settings(stack_dir, redis_password=SecretStr(PASSWORD))
    try:
        yield settings, by_name(stack_up(settings))
    finally:
        stack_down(settings)


def test_up_starts_both_and_second_up_reuses(
    running: tuple[Settings, dict[str, ComponentStatus]],
) -> None:
    settings, first = running
    assert {name: status.state for name, status in first.items()} == {
        "kafka": "running",
        "redis": "running",
    }
    assert first["kafka"].address == f"127.0.0.1:{settings.stack_kafka_port}"
    assert all(status.pid is not None and alive(status.pid) for status in first.values())
    again = by_name(stack_up(settings))
    assert {name: status.pid for name, status in again.items()} == {
        name: status.pid for name, status in first.items()
    }
    assert {status.detail for status in again.values()} == {"already running"}
    now = by_name(stack_status(settings))
    assert {name: (status.state, status.pid) for name, status in now.items()} == {
        name: ("running", status.pid) for name, status in first.items()
    }


def test_redis_requires_the_password_which_never_reaches_argv(
    running: tuple[Settings, dict[str, ComponentStatus]],
) -> None:
    settings, first = running
    port = settings.stack_redis_port
    with redis.Redis(host="127.0.0.1", port=port, password=PASSWORD, socket_timeout=5) as client:
        assert client.ping()
    # A raw PING: redis-py 8 retries a refused HELLO for seconds before it gives up.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"PING\r\n")
        assert raw.recv(100).startswith(b"-NOAUTH")
    pid = first["redis"].pid
    assert pid is not None
    assert "s3cret" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    auth = settings.stack_dir / "run" / f"redis-{port}" / "auth.conf"
    assert auth.stat().st_mode & 0o777 == 0o600


def test_topics_created_then_exist_with_partitions_and_retention(
    running: tuple[Settings, dict[str, ComponentStatus]],
) -> None:
    settings, _ = running
    names = [topic.name for topic in ALL_TOPICS]
    created = create_topics(settings, partitions=3, retention_ms=3_600_000)
    assert created == [(name, "created") for name in names]
    assert create_topics(settings, partitions=5) == [(name, "exists") for name in names]
    admin = AdminClient(settings.kafka_client_config())
    metadata = admin.list_topics(timeout=10)
    assert {name: len(metadata.topics[name].partitions) for name in names} == {
        name: 3 for name in names
    }
    resource = ConfigResource(ResourceType.TOPIC, names[0])
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["retention.ms"].value == "3600000"


def test_foreign_listener_on_kafka_port(
    running: tuple[Settings, dict[str, ComponentStatus]], stack_dir: Path
) -> None:
    del running  # a live stack elsewhere must not change the verdict on another port
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        settings = scratch_settings(stack_dir, stack_kafka_port=port)
        assert by_name(stack_status(settings))["kafka"].state == "foreign"
        with pytest.raises(StackError, match=f"port {port} on 127.0.0.1 is taken"):
            stack_up(settings)
        assert not (stack_dir / "run" / f"kafka-{port}" / "kafka.pid").exists()
        assert by_name(stack_status(settings))["redis"].state == "stopped"


def test_kafka_that_dies_while_starting_is_reported(stack_dir: Path) -> None:
    settings = scratch_settings(stack_dir)
    try:
        stack_up(settings)
        stack_down(settings)
        meta = stack_dir / "run" / f"kafka-{settings.stack_kafka_port}" / "data" / "meta.properties"
        meta.write_text(meta.read_text().replace("node.id=1", "node.id=7"))
        with pytest.raises(StackError, match=r"kafka exited while starting: .*node id 7") as caught:
            stack_up(settings)
        assert "kafka.log" in str(caught.value)
        assert by_name(stack_status(settings))["kafka"].state == "stale"
    finally:
        stack_down(settings)
    assert {status.state for status in stack_status(settings)} == {"stopped"}


def test_down_stops_both_and_is_idempotent(
    running: tuple[Settings, dict[str, ComponentStatus]],
) -> None:
    settings, first = running
    down = by_name(stack_down(settings))
    assert {status.state for status in down.values()} == {"stopped"}
    assert all(status.detail.startswith("stopped pid") for status in down.values())
    for status in first.values():
        assert status.pid is not None and not alive(status.pid)
    assert {status.state for status in stack_status(settings)} == {"stopped"}
    again = stack_down(settings)
    assert {status.detail for status in again} == {"not running"}
    assert not any(
        (settings.stack_dir / "run" / f"{name}-{port}" / f"{name}.pid").exists()
        for name, port in (
            ("kafka", settings.stack_kafka_port),
            ("redis", settings.stack_redis_port),
        )
    )

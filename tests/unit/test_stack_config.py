"""The local stack without starting it: rendered config, port and pid-file checks, the CLI."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from c4.cli import main
from c4.settings import Settings
from c4.stack import (
    StackError,
    ensure_kafka_jars,
    new_cluster_id,
    render_pom,
    render_server_properties,
    stack_down,
    stack_status,
    stack_up,
)
from c4.stack.supervise import Component, last_line, wait_ready


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now (bound to 0, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    kafka, controller, redis = free_ports(3)
    return Settings(
        stack_dir=tmp_path,
        stack_kafka_port=kafka,
        stack_controller_port=controller,
        stack_redis_port=redis,
    )


@pytest.fixture
def listener() -> Iterator[int]:
    """A plain TCP server on a free port: a process that is not ours holding a stack port."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def parse_properties(text: str) -> dict[str, str]:
    entries = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            entries[key] = value
    return entries


def test_server_properties_single_node_kraft(tmp_path: Path) -> None:
    settings = Settings(stack_kafka_port=19092, stack_controller_port=19093)
    entries = parse_properties(render_server_properties(settings, tmp_path / "data"))
    assert entries["process.roles"] == "broker,controller"
    assert entries["node.id"] == "1"
    assert entries["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert "controller.quorum.voters" not in entries  # formatted --standalone instead
    assert entries["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert entries["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert entries["controller.listener.names"] == "CONTROLLER"
    assert entries["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert entries["log.dirs"] == str(tmp_path / "data")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert entries[key] == "1", key
    assert entries["group.initial.rebalance.delay.ms"] == "0"
    assert entries["auto.create.topics.enable"] == "true"
    assert entries["num.partitions"] == "8"


def test_pom_pins_kafka_and_a_matching_slf4j() -> None:
    pom = render_pom("4.1.1")
    assert "<artifactId>kafka_2.13</artifactId>\n      <version>4.1.1</version>" in pom
    # slf4j-api and its provider must share a major version, or the broker logs nothing.
    api = re.search(r"slf4j-api</artifactId>\s*<version>(\d+)\.", pom)
    simple = re.search(r"slf4j-simple</artifactId>\s*<version>(\d+)\.", pom)
    assert api is not None and simple is not None
    assert api.group(1) == simple.group(1) == "2"


def test_cluster_id_looks_like_kafka_uuid() -> None:
    for _ in range(200):
        cluster_id = new_cluster_id()
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id)
        assert not cluster_id.startswith("-")


def test_foreign_listener_on_kafka_port_is_refused(settings: Settings, listener: int) -> None:
    settings = settings.model_copy(update={"stack_kafka_port": listener})
    kafka = next(status for status in stack_status(settings) if status.name == "kafka")
    assert kafka.state == "foreign"
    assert kafka.pid is None
    with pytest.raises(StackError, match=f"port {listener} on 127.0.0.1 is taken") as caught:
        stack_up(settings)
    assert "C4_STACK_KAFKA_PORT" in str(caught.value)
    assert "\n" not in str(caught.value)
    # Refused before anything started: no pid file, and down leaves the listener alone.
    assert not list(settings.stack_dir.rglob("*.pid"))
    down = {status.name: status for status in stack_down(settings)}
    assert down["kafka"].state == "foreign"
    socket.create_connection(("127.0.0.1", listener), timeout=1).close()


def test_foreign_listener_on_controller_port_names_its_setting(
    settings: Settings, listener: int
) -> None:
    settings = settings.model_copy(update={"stack_controller_port": listener})
    with pytest.raises(StackError, match="C4_STACK_CONTROLLER_PORT"):
        stack_up(settings)


def test_ports_must_differ(settings: Settings) -> None:
    settings = settings.model_copy(update={"stack_redis_port": settings.stack_kafka_port})
    with pytest.raises(StackError, match="must differ"):
        stack_up(settings)


def test_stale_pid_file_is_reported_and_removed(settings: Settings) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir = settings.stack_dir / "run" / f"redis-{settings.stack_redis_port}"
    run_dir.mkdir(parents=True)
    (run_dir / "redis.pid").write_text(f"{dead.pid}\n")
    redis = next(status for status in stack_status(settings) if status.name == "redis")
    assert redis.state == "stale"
    down = {status.name: status for status in stack_down(settings)}
    assert down["redis"].state == "stopped"
    assert down["redis"].detail == "stale pid file removed"
    assert not (run_dir / "redis.pid").exists()


def test_recycled_pid_is_never_signalled(settings: Settings) -> None:
    # The pid file names a live process that is not Kafka (this test run): hands off.
    run_dir = settings.stack_dir / "run" / f"kafka-{settings.stack_kafka_port}"
    run_dir.mkdir(parents=True)
    (run_dir / "kafka.pid").write_text(f"{os.getpid()}\n")
    kafka = next(status for status in stack_status(settings) if status.name == "kafka")
    assert kafka.state == "stale"
    stack_down(settings)  # would SIGTERM this very process if it trusted the pid file
    assert not (run_dir / "kafka.pid").exists()


def test_missing_java_names_the_fix(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(settings.stack_dir / "empty"))
    with pytest.raises(StackError, match=r"java not found: install OpenJDK 17\+ \(apt-get"):
        ensure_kafka_jars(settings)


def test_last_line_skips_stack_frames(tmp_path: Path) -> None:
    log = tmp_path / "kafka.log"
    log.write_text(
        "INFO starting\n"
        "ERROR kafka.Kafka$ - Exiting Kafka due to fatal exception\n"
        "java.lang.RuntimeException: Stored node id 7 doesn't match previous node id 1\n"
        "\tat kafka.server.KafkaRaftServer.<init>(KafkaRaftServer.scala:57)\n"
        "\tat java.base/java.lang.Thread.run(Thread.java:840)\n"
        "\t... 3 more\n"
    )
    assert last_line(log).startswith("java.lang.RuntimeException: Stored node id 7")
    assert last_line(tmp_path / "missing.log") == "(no log)"


def test_cli_status_json_one_line_per_component(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("C4_STACK_DIR", str(settings.stack_dir))
    monkeypatch.setenv("C4_STACK_KAFKA_PORT", str(settings.stack_kafka_port))
    monkeypatch.setenv("C4_STACK_CONTROLLER_PORT", str(settings.stack_controller_port))
    monkeypatch.setenv("C4_STACK_REDIS_PORT", str(settings.stack_redis_port))
    assert main(["stack", "status", "--json"]) == 3  # LSB's "not running"
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["kafka", "redis"]
    assert {json.loads(line)["state"] for line in lines} == {"stopped"}
    assert main(["stack", "down"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_cli_up_on_taken_port_is_exit_1(
    settings: Settings,
    listener: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("C4_STACK_DIR", str(settings.stack_dir))
    monkeypatch.setenv("C4_STACK_KAFKA_PORT", str(settings.stack_kafka_port))
    monkeypatch.setenv("C4_STACK_CONTROLLER_PORT", str(settings.stack_controller_port))
    monkeypatch.setenv("C4_STACK_REDIS_PORT", str(listener))
    assert main(["stack", "up"]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"c4: error: port {listener} on 127.0.0.1 is taken")
    assert "C4_STACK_REDIS_PORT" in error


def _logging_child(log: Path, seconds: float) -> subprocess.Popen[bytes]:
    """A live process standing in for a broker: it appends a line to ``log`` every 50 ms for
    ``seconds`` (a broker recovering its partitions), then only sleeps."""
    script = (
        "import sys, time\n"
        f"end = time.monotonic() + {seconds}\n"
        "while time.monotonic() < end:\n"
        f"    open({str(log)!r}, 'a').write('INFO loaded a partition\\n'); time.sleep(0.05)\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", script])


def test_a_component_that_keeps_logging_is_waited_for_past_the_timeout(tmp_path: Path) -> None:
    component = Component("kafka", tmp_path, ((free_ports(1)[0], "C4_STACK_KAFKA_PORT"),))
    child = _logging_child(component.log_file, 1.5)
    answers_after = time.monotonic() + 1.2
    try:
        # Quiet for at most 0.5 s at a time, so a log that grows keeps the wait going.
        wait_ready(component, child.pid, lambda _: time.monotonic() >= answers_after, 0.5, 30.0)
    finally:
        child.kill()
        child.wait()


def test_a_component_whose_log_stops_growing_times_out_naming_the_quiet(tmp_path: Path) -> None:
    component = Component("kafka", tmp_path, ((free_ports(1)[0], "C4_STACK_KAFKA_PORT"),))
    child = _logging_child(component.log_file, 1.5)
    try:
        # The overall limit holds even while the log keeps growing.
        with pytest.raises(StackError, match="did not answer"):
            wait_ready(component, child.pid, lambda _: False, 0.6, 0.3)
        began = time.monotonic()
        with pytest.raises(StackError, match=r"without a log line\): INFO loaded a partition"):
            wait_ready(component, child.pid, lambda _: False, 0.6, 30.0)
        assert time.monotonic() - began < 10
    finally:
        child.kill()
        child.wait()

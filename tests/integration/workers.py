"""Helpers of the integration tier: unique topics and Faust workers run as subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

REPO = Path(__file__).resolve().parents[2]
ADMIN_TIMEOUT_S = 30.0
# Gone already, or a member of a killed worker still inside its session: nothing to do.
GROUP_LEFT_AS_IS = {KafkaError.GROUP_ID_NOT_FOUND, KafkaError.NON_EMPTY_GROUP}


def create_topics(bootstrap: str, names: list[str], partitions: int = 4) -> None:
    """Create fresh topics and wait until the broker has them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in names]
    )
    for future in futures.values():
        future.result(30)


def names_holding(bootstrap: str, token: str) -> tuple[list[str], list[str]]:
    """The topics and the consumer groups on the broker whose names hold ``token``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = sorted(name for name in admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics)
    listed = admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result(ADMIN_TIMEOUT_S)
    groups = sorted(str(group.group_id) for group in listed.valid)
    return [name for name in topics if token in name], [name for name in groups if token in name]


def delete_names_holding(bootstrap: str, token: str) -> list[str]:
    """Delete the topics (Faust's changelog and internal ones too) and the consumer groups
    whose names hold a test's unique ``token``: only that test made them. The topics deleted.

    The broker keeps every topic until it is deleted: left behind, they ran its 512 MiB heap
    out over a run of the suite.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics, groups = names_holding(bootstrap, token)
    if topics:
        deleting = admin.delete_topics(
            topics, operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S
        )
        for future in deleting.values():
            try:
                future.result(ADMIN_TIMEOUT_S + 5)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
    if groups:
        for future in admin.delete_consumer_groups(
            groups, request_timeout=ADMIN_TIMEOUT_S
        ).values():
            try:
                future.result(ADMIN_TIMEOUT_S + 5)
            except KafkaException as error:
                if error.args[0].code() not in GROUP_LEFT_AS_IS:
                    raise
    return topics


class FaustWorker:
    """``python -m MODULE worker`` with its own topics and group; log kept for failures."""

    def __init__(self, module: str, env: dict[str, str], log_path: Path) -> None:
        self._args = [sys.executable, "-m", module, "worker", "-l", "warn", "--without-web"]
        self._env = dict(os.environ, PYTHONPATH=str(REPO), **env)
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> FaustWorker:
        log = self._log_path.open("wb")
        # Run in the log's folder: Faust puts an app's default data folder in its cwd.
        self._process = subprocess.Popen(
            self._args,
            cwd=self._log_path.parent,
            env=self._env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()  # the child holds its own descriptor
        return self

    @property
    def pid(self) -> int:
        """The worker's process id (to pause it with SIGSTOP, say)."""
        assert self._process is not None
        return self._process.pid

    def kill(self) -> None:
        """kill -9: no shutdown, no commit, no goodbye to the consumer group."""
        assert self._process is not None
        self._process.kill()
        self._process.wait(30)

    def assert_alive(self) -> None:
        """Fail the test with the worker's last log lines when it has exited."""
        assert self._process is not None
        if self._process.poll() is not None:
            tail = self._log_path.read_text(errors="replace")[-3000:]
            message = f"worker exited {self._process.returncode}:\n{tail}"
            raise AssertionError(message)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._process is not None
        self._process.terminate()
        self._process.wait(30)

"""Fixtures of the integration tier: the real local stack (started by scripts/test.sh)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from c4.settings import Settings
from c4.stack import StackError, kube_down, kube_status, kube_up
from c4.stack.slurm import slurm_down, slurm_status, slurm_up
from tests.integration.actions_harness import Cluster, HttpReceiver
from tests.integration.private_stack import PrivateStack
from tests.integration.workers import delete_names_holding


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The broker the integration tests use; failing, never skipping, when it is down."""
    bootstrap = os.environ.get("C4_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15)
    except KafkaException as error:
        pytest.fail(f"no Kafka broker at {bootstrap} ({error}): run `c4 stack up` first")
    return bootstrap


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The Redis the integration tests use; failing, never skipping, when it is down."""
    url = os.environ.get("C4_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(f"no Redis at {url} ({error}): run `c4 stack up` first")
    finally:
        client.close()
    yield url


SLURM_PORT = 17817  # slurmctld; its slurmds take the next four


@pytest.fixture(scope="session")
def slurm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A real Slurm cluster of four nodes (node-000..003) for the session, on ports of its
    own, stopped at the end. A missing Slurm is installed; one that does not come up fails
    the tests that need it (never a skip)."""
    made = Settings(stack_dir=tmp_path_factory.mktemp("slurm-stack"), stack_slurm_port=SLURM_PORT)
    try:
        try:
            first = slurm_up(made)
        except StackError as error:
            pytest.fail(f"the local Slurm cluster did not come up: {error}")
        again = slurm_up(made)  # idempotent: the same daemons, nothing started twice
        assert [s.pid for s in again] == [s.pid for s in first]
        assert {s.detail for s in again} == {"already running"}
        yield made
    finally:
        stopped = slurm_down(made)
        assert {s.state for s in stopped} <= {"stopped"}
        assert all(s.state == "stopped" for s in slurm_status(made))


KUBE_PORT = 16443  # kube-apiserver's secure port
ETCD_PORT = 12379  # etcd's client port; its peer port is the next one


@pytest.fixture(scope="session")
def kube_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A real Kubernetes API server (etcd and kube-apiserver) for the session, on ports of its
    own, stopped at the end. A missing etcd is installed; a server that does not come up
    fails the tests that need it (never a skip). `c4.stack.kubeconfig_path` gives a client
    the kubeconfig of ``admin`` or ``c4-actions``."""
    made = Settings(
        stack_dir=tmp_path_factory.mktemp("kube-stack"),
        stack_kube_port=KUBE_PORT,
        stack_etcd_port=ETCD_PORT,
    )
    try:
        try:
            first = kube_up(made)
        except StackError as error:
            pytest.fail(f"the local Kubernetes API server did not come up: {error}")
        again = kube_up(made)  # idempotent: the same processes, nothing started twice
        assert [s.pid for s in again] == [s.pid for s in first]
        assert {s.detail for s in again} == {"already running"}
        yield made
    finally:
        stopped = kube_down(made)
        assert {s.state for s in stopped} <= {"stopped"}
        assert all(s.state == "stopped" for s in kube_status(made))


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh suffix for topic and group names, so tests never share state; what a test
    named with it on the shared broker (topics, Faust's changelogs, groups) is deleted after."""
    token = uuid.uuid4().hex[:10]
    # Only a test of the shared broker left names there (a private stack goes with its data).
    shared = "kafka_bootstrap" in request.fixturenames
    bootstrap: str | None = request.getfixturevalue("kafka_bootstrap") if shared else None
    yield token
    if bootstrap is not None:
        delete_names_holding(bootstrap, token)


@pytest.fixture
def private_stack() -> Iterator[PrivateStack]:
    """A Kafka and a Redis of this test's own, for tests that stop, kill or restart them."""
    with PrivateStack() as stack:
        yield stack


@pytest.fixture
def cluster(kafka_bootstrap: str, redis_url: str, unique: str) -> Iterator[Cluster]:
    """The actions worker's world: its own topics, Redis key prefix and configuration."""
    made = Cluster(kafka_bootstrap, redis_url, unique)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    """A real HTTP receiver on 127.0.0.1 for webhooks (launcher, alerts)."""
    server = HttpReceiver()
    try:
        yield server
    finally:
        server.close()

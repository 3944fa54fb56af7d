"""Helpers of the action-worker integration tests: a real HTTP receiver, a cluster, workers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer

from actions.config import WorkerConfig, parse_config
from actions.metrics import ActionMetrics
from actions.pipeline.pipeline import Pipeline
from actions.state.store import RedisState
from actions.transport import KafkaTransport
from actions.worker import ActionWorker, Topics, build_executors, build_housekeeping
from schemas.codec import decode
from schemas.messages import Action
from schemas.topics import ALL_TOPICS
from tests.integration.workers import REPO, create_topics
from topology.generate import Shape, generate

SECRET = "s3cret-for-tests"  # noqa: S105 - a test key, not a credential
SECRET_ENV = "C4_TEST_ALERT_SECRET"  # noqa: S105 - the variable's name
# 16 nodes, 8 per leaf: node-000..007 on leaf-0a/leaf-0b, node-008..015 on leaf-1a/leaf-1b.
TOPOLOGY = generate(Shape(nodes=16, spines=2, nics=1, planes=2, nodes_per_leaf=8, gpus=8))


@dataclass
class Request:
    """One request the receiver got, and when (``time.monotonic``)."""

    path: str
    headers: dict[str, str]
    body: bytes
    at_s: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class HttpReceiver:
    """A real local HTTP server; each path answers from its script of statuses (then 200)."""

    scripts: dict[str, list[int]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append(Request(self.path, dict(self.headers.items()), body))
                script = receiver.scripts.get(self.path, [])
                status = script.pop(0) if script else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                del format, args

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    def at(self, path: str) -> list[Request]:
        return [request for request in self.requests if request.path == path]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], Any], timeout_s: float = 30.0, what: str = "") -> Any:
    """Poll until the predicate returns something truthy; fail naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    message = f"timed out after {timeout_s} s waiting for {what or predicate}"
    raise AssertionError(message)


class Cluster:
    """Topics under a unique prefix, a Redis key prefix, the topology loaded, spares added."""

    def __init__(self, bootstrap: str, redis_url: str, unique: str, partitions: int = 1) -> None:
        self.bootstrap = bootstrap
        self.redis_url = redis_url
        self.prefix = f"test.{unique}."
        self.key_prefix = f"test:{unique}"
        self.unique = unique
        names = [self.prefix + t.name for t in ALL_TOPICS]
        create_topics(bootstrap, names, partitions=partitions)
        self.state = RedisState.connect(redis_url, prefix=self.key_prefix)
        self.state.components.load_topology(TOPOLOGY)
        self._producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self._seen: dict[str, list[bytes]] = {}
        self._consumers: dict[str, Consumer] = {}

    def spares(self, *nodes: str) -> None:
        for node in nodes:
            now = time.time_ns()
            added = self.state.components.add_spare(node, now, now // 1_000_000, "test")
            assert added.outcome == "ok"

    def send(
        self,
        kind: str,
        value: bytes | dict[str, Any],
        key: str = "k",
        partition: int | None = None,
    ) -> None:
        """Publish one record (to ``partition``, else where its key goes) and wait for it."""
        data = value if isinstance(value, bytes) else orjson.dumps(value)
        if partition is None:
            self._producer.produce(self.topic(kind), value=data, key=key.encode())
        else:
            self._producer.produce(self.topic(kind), data, key.encode(), partition)
        assert self._producer.flush(30) == 0

    def topic(self, kind: str) -> str:
        return self.prefix + f"c4.{kind}.v1"

    def job(self, job: str, nodes: list[str], ts_ns: int = 1_000, state: str = "running") -> None:
        """Publish a job placement and wait until the worker recorded it."""
        self.send("job", job_message(job, nodes, ts_ns, state), key=job)
        wait_for(lambda: self.state.jobs.placement(job), what=f"placement of {job} recorded")

    def messages(self, kind: str) -> list[bytes]:
        """Every message on a topic so far (read incrementally)."""
        topic = self.topic(kind)
        consumer = self._consumers.get(topic)
        if consumer is None:
            consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"check-{self.unique}-{kind}",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
            consumer.subscribe([topic])
            self._consumers[topic] = consumer
        seen = self._seen.setdefault(topic, [])
        while True:
            record = consumer.poll(0.3)
            if record is None:
                return list(seen)
            if record.error() is None:
                seen.append(record.value() or b"")

    def actions(self) -> list[Action]:
        found = []
        for value in self.messages("action"):
            action = decode(value, "action")
            assert isinstance(action, Action), action
            found.append(action)
        return found

    def wait_actions(self, count: int, timeout_s: float = 40.0) -> list[Action]:
        return list(
            wait_for(
                lambda: (found := self.actions()) and len(found) >= count and found,
                timeout_s,
                f"{count} action records",
            )
        )

    def env(self) -> dict[str, str]:
        return {
            "C4_KAFKA_BOOTSTRAP": self.bootstrap,
            "C4_REDIS_URL": self.redis_url,
            "C4_TOPIC_PREFIX": self.prefix,
            "C4_REDIS_KEY_PREFIX": self.key_prefix,
            SECRET_ENV: SECRET,
        }

    def close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        keys = list(self.state.client.scan_iter(match=f"{self.key_prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            self.state.client.delete(*keys[start : start + 500])
        self.state.close()


def job_message(
    job: str, nodes: list[str], ts_ns: int = 1_000, state: str = "running"
) -> dict[str, Any]:
    """A v1 job placement: 2 ranks per node, one communicator."""
    ranks = [
        {"rank": 2 * i + g, "node": node, "gpu": g, "port": "mlx5_0:1"}
        for i, node in enumerate(nodes)
        for g in range(2)
    ]
    return {
        "v": 1,
        "kind": "job",
        "job": job,
        "ts_ns": ts_ns,
        "state": state,
        "ranks": ranks,
        "comms": {"c0": [r["rank"] for r in ranks]},
    }


def config(receiver: HttpReceiver | None = None, **overrides: Any) -> dict[str, Any]:
    """A worker configuration: fast retries, a signed receiver and a launcher webhook."""
    data: dict[str, Any] = {
        "retry": {"tries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2},
        "claim_lease_s": 2,
    }
    if receiver is not None:
        data["receivers"] = [
            {
                "name": "oncall",
                "url": receiver.url("/alert"),
                "secret_env": SECRET_ENV,
                "timeout_s": 2,
                "retry": {"tries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2},
            }
        ]
        data["launcher"] = {"webhook": {"url": receiver.url("/launch"), "timeout_s": 2}}
    data.update(overrides)
    return data


@contextmanager
def worker(
    cluster: Cluster,
    data: dict[str, Any],
    group: str = "actions",
    dry_run: bool = False,
    housekeeping: bool = False,
    actor: str | None = None,
) -> Iterator[ActionMetrics]:
    """An action worker on a thread of this process, stopped on exit; with ``housekeeping``
    it does between records what ``c4 actions worker`` does (resend alerts, mirror spares).
    Workers of one ``group`` are one consumer group; ``actor`` names a worker in its claims
    (``test-<group>`` unless given: two workers of one group need one each)."""
    settings: WorkerConfig = parse_config(data, {SECRET_ENV: SECRET})
    stop = threading.Event()
    topics = Topics.with_prefix(cluster.prefix)
    transport = KafkaTransport(
        {"bootstrap.servers": cluster.bootstrap},
        f"{group}-{cluster.unique}",
        [topics.diagnosis, topics.job],
        cluster.prefix,
        stop,
    )
    state = RedisState.connect(cluster.redis_url, prefix=cluster.key_prefix)
    metrics = ActionMetrics()
    executors = build_executors(state, settings, transport, metrics)
    name = actor or f"test-{group}"
    pipeline = Pipeline(state, executors, settings, name, dry_run=dry_run)
    chores = build_housekeeping(state, settings, name) if housekeeping else None
    loop = ActionWorker(transport, state.jobs, pipeline, topics, metrics, stop, chores)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            loop.run()
        except BaseException as error:  # the test fails with it below
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield metrics
    finally:
        stop.set()
        thread.join(30)
        transport.close()
        state.close()
    assert not errors, errors


class WorkerProcess:
    """``c4 actions worker`` as a subprocess (for kill -9), log kept for failures."""

    def __init__(self, cluster: Cluster, config_path: Path, log_path: Path, **env: str) -> None:
        self.log_path = log_path
        args = [sys.executable, "-m", "c4.cli", "actions", "worker", "--config", str(config_path)]
        args += ["--group", f"proc-{cluster.unique}", "--metrics-port", "0"]
        environment = dict(os.environ, PYTHONPATH=str(REPO), **cluster.env(), **env)
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                args, cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


def diagnosis(
    ident: str,
    job: str | None,
    suspects: list[tuple[str, str, float]],
    cls: str = "noncomm_hang",
    state: str = "firing",
    onset_ns: int = 1_733_130_000_000_000_000,
) -> dict[str, Any]:
    """A v1 diagnosis message (its onset a fixed time in the past unless given)."""
    return {
        "v": 1,
        "kind": "diagnosis",
        "id": ident,
        "job": job,
        "state": state,
        "class": cls,
        "onset_ns": onset_ns,
        "ts_ns": onset_ns + 12_000_000_000,
        "suspects": [{"type": t, "id": i, "score": s} for t, i, s in suspects],
        "evidence": {"comm": "c0", "seq": 1001, "waiting_ranks": 14},
    }


def state_release(
    cluster: Cluster, config_path: Path, ident: str
) -> subprocess.CompletedProcess[str]:
    """``c4 state release ID --config FILE``, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", "state", "release", ident, "--config", str(config_path)],
        capture_output=True,
        text=True,
        env={**os.environ, **cluster.env(), "PYTHONPATH": str(REPO)},
        timeout=60,
        check=False,
    )

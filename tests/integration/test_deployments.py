"""Two deployments on one broker and one Redis: neither sees the other's names or work.

Deployments A and B each run ``c4 streams worker``, ``c4 actions worker`` and a dashboard
feed, told apart by ``C4_DEPLOYMENT`` alone. A job reported to A is A's only: with A's
streams worker killed, B's never takes the job over from A's changelog (as it did while
every deployment's Faust app was ``c4-streams``), and every topic, changelog, consumer group,
Redis key and data folder is one deployment's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from actions.state.store import RedisState
from c4.dashboard.feed import Feed
from c4.demo.processes import free_port
from c4.settings import Settings
from c4.topics import create_topics
from schemas.topics import TopicNames
from tests.integration.live_runs import publish
from tests.integration.workers import REPO, delete_names_holding, names_holding
from tests.unit.ring_job import RingJob

PARTITIONS = 2
SESSION_TIMEOUT_S = 6  # how soon a killed streams worker's group empties
WAIT_S = 120.0


class Command:
    """A ``c4`` command running in the background, its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self._args = [sys.executable, "-m", "c4.cli", *args]
        self._env = env
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Command:
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(  # noqa: S603 - this interpreter, our command
                self._args,
                cwd=self.log_path.parent,
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def log(self) -> str:
        """What the command has written so far."""
        return self.log_path.read_text(errors="replace")

    def assert_alive(self) -> None:
        """Fail with the command's last lines when it has exited."""
        assert self._process is not None
        if self._process.poll() is not None:
            command = " ".join(self._args[3:5])  # after "python -m c4.cli"
            message = f"c4 {command} exited {self._process.returncode}:\n{self.log()[-3000:]}"
            raise AssertionError(message)

    def kill(self) -> None:
        """kill -9: no goodbye to its consumer group."""
        assert self._process is not None
        self._process.kill()
        self._process.wait(30)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._process is not None
        self._process.terminate()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(30)


def wait_until(done: Callable[[], bool], alive: Callable[[], None], what: str) -> None:
    """Until ``done()``, checking ``alive()`` between tries; failing after `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        alive()
        if done():
            return
        time.sleep(0.5)
    message = f"timed out after {WAIT_S:g} s waiting for {what}"
    raise AssertionError(message)


def group_state(admin: AdminClient, group: str) -> tuple[str, set[str]]:
    """A consumer group's state (``STABLE``, ``EMPTY``, ...) and the topics its members hold."""
    try:
        description = admin.describe_consumer_groups([group])[group].result(10)
    except (TimeoutError, KafkaException):  # a busy broker, or no such group yet
        return "UNKNOWN", set()
    topics = {tp.topic for m in description.members for tp in m.assignment.topic_partitions}
    return str(description.state).rsplit(".", 1)[-1], topics


def records_in(bootstrap: str, topic: str) -> int:
    """How many records a topic has had (the sum of its partitions' high watermarks)."""
    # Watermarks only: the consumer joins no group, so it leaves none behind.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            return 0
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in metadata.partitions
        )
    finally:
        consumer.close()


def deployment_env(settings: Settings, stack_dir: Path) -> dict[str, str]:
    """A process's environment for one deployment: its name, the test's broker and Redis."""
    ours = {f"C4_{name.upper()}" for name in Settings.model_fields}
    env = {key: value for key, value in os.environ.items() if key not in ours}
    return env | {
        "PYTHONPATH": str(REPO),
        "C4_DEPLOYMENT": settings.deployment,
        "C4_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "C4_REDIS_URL": settings.redis_url,
        "C4_TOPIC_PARTITIONS": str(PARTITIONS),
        "C4_STACK_DIR": str(stack_dir),
        # The streams worker reads C4_STREAMS_* as faust -A does: a killed one's group
        # empties in seconds, not the default minute.
        "C4_STREAMS_SESSION_TIMEOUT": str(SESSION_TIMEOUT_S),
        "C4_STREAMS_SNAPSHOT_INTERVAL": "0.5",
        "C4_STREAMS_METRICS_PORT": "0",
    }


def test_two_deployments_share_a_broker_and_a_redis_apart(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path
) -> None:
    stack_dir = tmp_path / "stack"
    ours, theirs = (
        Settings(
            deployment=f"dep{unique}{side}",
            kafka_bootstrap=kafka_bootstrap,
            redis_url=redis_url,
            topic_partitions=PARTITIONS,
            stack_dir=stack_dir,
        )
        for side in "ab"
    )
    assert ours.topic_prefix == f"dep{unique}a."
    assert theirs.redis_key_prefix == f"dep{unique}b.c4"
    for settings in (ours, theirs):
        create_topics(settings)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    client = redis.Redis.from_url(redis_url)
    job = RingJob(job=f"job-{unique}", stuck_rank={11: 40})
    our_state = RedisState.connect(redis_url, prefix=ours.redis_key_prefix)
    their_state = RedisState.connect(redis_url, prefix=theirs.redis_key_prefix)
    our_feed, their_feed = (
        Feed(s.kafka_client_config(), s.topic_prefix, s.names.dashboard_group())
        for s in (ours, theirs)
    )

    def streams_worker(settings: Settings, side: str) -> Command:
        args = ["streams", "worker", "--loglevel", "info", "--web-port", str(free_port())]
        env = deployment_env(settings, stack_dir)
        return Command(args, env, tmp_path / f"{side}-streams.log")

    def actions_worker(settings: Settings, side: str) -> Command:
        args = ["actions", "worker", "--dry-run", "--metrics-port", "0"]
        return Command(args, deployment_env(settings, stack_dir), tmp_path / f"{side}-actions.log")

    our_streams, their_streams = streams_worker(ours, "a"), streams_worker(theirs, "b")
    our_actions, their_actions = actions_worker(ours, "a"), actions_worker(theirs, "b")
    try:
        our_feed.start()
        their_feed.start()
        with our_streams, our_actions, their_streams, their_actions:
            running = [our_streams, our_actions, their_streams, their_actions]

            def alive() -> None:
                for command in running:
                    command.assert_alive()

            wait_until(
                lambda: group_state(admin, theirs.names.streams_app_id)[0] == "STABLE",
                alive,
                "B's streams worker in its group",
            )
            our_topics = TopicNames(ours.topic_prefix)
            publish(
                kafka_bootstrap,
                lambda m: our_topics.of_kind(m.kind),  # type: ignore[attr-defined]
                [job.job_message(), *job.messages()],
            )
            our_changelog = f"{ours.names.streams_app_id}-job-state-changelog"
            their_changelog = f"{theirs.names.streams_app_id}-job-state-changelog"
            wait_until(
                lambda: records_in(kafka_bootstrap, our_changelog) > 0,
                alive,
                f"A's snapshot of {job.job} in {our_changelog}",
            )
            wait_until(
                lambda: our_state.jobs.placement(job.job) is not None,
                alive,
                f"A's actions worker to record {job.job}",
            )
            # A's streams worker gone: a group B shared would hand A's partitions, and the
            # job's snapshot with them, to B once A's session ran out.
            our_streams.kill()
            running.remove(our_streams)
            wait_until(
                lambda: group_state(admin, ours.names.streams_app_id)[0] == "EMPTY",
                alive,
                "A's streams group to empty",
            )
            state, their_assigned = group_state(admin, theirs.names.streams_app_id)
            assert state == "STABLE"
            assert their_assigned
            assert all(topic.startswith(theirs.topic_prefix) for topic in their_assigned)
            topics, groups = names_holding(kafka_bootstrap, unique)
            keys = [key.decode() for key in client.scan_iter(match=f"*{unique}*", count=1000)]
            alive()
        # B never had A's job: not from A's changelog, nor from A's topics or Redis keys.
        assert "took over" not in their_streams.log()
        assert job.job not in their_streams.log() + their_actions.log()
        assert records_in(kafka_bootstrap, their_changelog) == 0
        assert their_state.jobs.placement(job.job) is None
        their_view = their_feed.view()
        assert (their_view.diagnoses, their_view.jobs, their_view.actions) == ((), (), ())
        assert {placement.job for placement in our_feed.view().jobs} == {job.job}

        # Every name either made is one deployment's; each has its own changelogs and groups.
        assert all(name.startswith((ours.topic_prefix, theirs.topic_prefix)) for name in topics)
        assert all(name.startswith((ours.topic_prefix, theirs.topic_prefix)) for name in groups)
        for settings in (ours, theirs):
            app_id = settings.names.streams_app_id
            changelogs = {f"{app_id}-job-state-changelog", f"{app_id}-node-state-changelog"}
            assert changelogs <= set(topics)
            assert {app_id, settings.names.actions_group} <= set(groups)
            feeds = [g for g in groups if g.startswith(settings.names.owned("c4-dashboard-"))]
            assert len(feeds) == 1
            assert (settings.deployment_dir / "faust" / app_id).is_dir()
        assert keys
        owned_keys = (f"{ours.redis_key_prefix}:", f"{theirs.redis_key_prefix}:")
        assert all(key.startswith(owned_keys) for key in keys)
    finally:
        our_feed.stop()
        their_feed.stop()
        for prefix in (ours.redis_key_prefix, theirs.redis_key_prefix):
            made = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if made:
                client.delete(*made)
        client.close()
        our_state.close()
        their_state.close()
    # What the test made on the broker goes with it (the fixture does it on a failure too).
    assert set(delete_names_holding(kafka_bootstrap, unique)) >= set(topics)
    wait_until(
        lambda: not names_holding(kafka_bootstrap, unique)[0], lambda: None, "the topics' deletion"
    )

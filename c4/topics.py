"""The v1 topics of a deployment on the broker: create them (idempotent) and list them.

For `c4 topics` and for the demo, which creates its run's own."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from c4 import C4Error
from schemas.topics import ALL_TOPICS, Topic, TopicNames

if TYPE_CHECKING:
    from c4.settings import Settings

ADMIN_TIMEOUT_S = 30.0


class TopicError(C4Error):
    """A topic could not be created or the broker could not be listed."""


def _admin(settings: Settings) -> AdminClient:
    # Level 2 (critical) silences librdkafka's "Connect ... failed" line, repeated every 50 ms
    # while the broker is down; the error raised below carries the reason once.
    return AdminClient({**settings.kafka_client_config(), "log_level": 2})


def _unreachable(settings: Settings, error: object) -> TopicError:
    message = (
        f"kafka at {settings.kafka_bootstrap} did not answer ({error}):"
        " run c4 stack up or check --bootstrap"
    )
    return TopicError(message)


def create_topics(
    settings: Settings,
    partitions: int | None = None,
    retention_ms: int | None = None,
    topics: Iterable[Topic] = ALL_TOPICS,
    timeout_s: float = ADMIN_TIMEOUT_S,
) -> list[tuple[str, str]]:
    """Create ``topics`` (replication 1); each comes back as (name, "created" | "exists").

    A topic that already exists is left as it is, whatever its partitions or retention.
    """
    count = settings.topic_partitions if partitions is None else partitions
    retention = settings.topic_retention_ms if retention_ms is None else retention_ms
    if count < 1:
        message = f"partitions must be at least 1 (got {count})"
        raise TopicError(message)
    if retention < -1:
        message = f"retention.ms must be -1 (forever) or more (got {retention})"
        raise TopicError(message)
    # dict.fromkeys: keeps the order, drops a name given twice (the admin API rejects those).
    here = TopicNames(settings.topic_prefix)
    names = list(dict.fromkeys(here.of(topic) for topic in topics))
    configs = {name: {"retention.ms": str(retention)} for name in names}
    return create_named_topics(settings, configs, count, timeout_s)


def create_named_topics(
    settings: Settings,
    configs: Mapping[str, Mapping[str, str]],
    partitions: int,
    timeout_s: float = ADMIN_TIMEOUT_S,
) -> list[tuple[str, str]]:
    """Create topics by name, each with its config (replication 1); each comes back as
    (name, "created" | "exists"), one that exists left as it is."""
    names = list(configs)
    if not names:
        return []
    admin = _admin(settings)
    new_topics = [
        NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=1,
            config=dict(configs[name]),
        )
        for name in names
    ]
    futures = admin.create_topics(
        new_topics, operation_timeout=timeout_s, request_timeout=timeout_s
    )
    results: list[tuple[str, str]] = []
    for name in names:
        try:
            futures[name].result(timeout=timeout_s + 5.0)
        except KafkaException as exception:
            error = exception.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                results.append((name, "exists"))
                continue
            if isinstance(error, KafkaError) and error.code() in {
                KafkaError._TRANSPORT,
                KafkaError._TIMED_OUT,
                KafkaError._ALL_BROKERS_DOWN,
            }:
                raise _unreachable(settings, error.str()) from exception
            detail = error.str() if isinstance(error, KafkaError) else str(error)
            message = f"creating topic {name} failed: {detail}"
            raise TopicError(message) from exception
        except concurrent.futures.TimeoutError as exception:
            raise _unreachable(settings, f"no reply in {timeout_s:.0f} s") from exception
        results.append((name, "created"))
    return results


def list_topics(settings: Settings, timeout_s: float = 10.0) -> list[tuple[str, int]]:
    """(name, partition count) of every topic but Kafka's internal ``__*`` ones, sorted."""
    admin = _admin(settings)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exception:
        error = exception.args[0]
        detail = error.str() if isinstance(error, KafkaError) else str(error)
        raise _unreachable(settings, detail) from exception
    found: list[tuple[str, int]] = []
    for name, topic in metadata.topics.items():
        if not str(name).startswith("__"):
            found.append((str(name), len(topic.partitions)))
    return sorted(found)

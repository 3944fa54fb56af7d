"""The Faust app: agents that decode the v1 input topics and hand models to handlers.

Agents only decode and delegate; what a handler does with a model (the detection core,
later) never sees Kafka. Rejected records go to ``c4.deadletter.v1``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import faust

from schemas.base import C4Model
from schemas.codec import RejectCode, Rejection, encode
from schemas.topics import (
    COLLECTIVE,
    DEADLETTER,
    DIAGNOSIS,
    GPU,
    JOB,
    LINK,
    ROUTE,
    Topic,
)
from streams.intake import decoded, decoded_records, send_dead_letter

log = logging.getLogger(__name__)

Handler = Callable[[str | None, C4Model], Awaitable[None]]
# Takes a record's valid messages at once; says which failed (index, error), for dead letters.
RecordHandler = Callable[[str | None, list[C4Model]], Awaitable[list[tuple[int, Exception]]]]
INPUT_TOPICS: tuple[Topic, ...] = (COLLECTIVE, LINK, GPU, JOB, ROUTE)


async def log_only(key: str | None, message: C4Model) -> None:
    """The handler used where none is given: count the message in the debug log."""
    log.debug("decoded %s keyed %s", type(message).__name__, key)


def create_app(
    app_id: str,
    broker: str,
    *,
    partitions: int = 8,
    topic_names: Mapping[str, str] | None = None,
    handlers: Mapping[str, Handler] | None = None,
    record_handlers: Mapping[str, RecordHandler] | None = None,
    web_port: int | None = None,
    web_bind: str = "127.0.0.1",
    broker_config: Mapping[str, Any] | None = None,
    on_reject: Callable[[str, Rejection], None] | None = None,
    raw_agents: Mapping[str, Callable[[Any], Awaitable[None]]] | None = None,
) -> faust.App:
    """A Faust app with one decoding agent per input kind.

    ``topic_names`` renames topics by kind (tests use unique names); ``handlers`` says what
    to do with each decoded kind, message by message; ``record_handlers`` (where given, in
    place of the handler) with a record's messages at once; ``raw_agents`` (where given, in
    place of both) the agent of a kind's topic itself, its records undecoded; ``web_port``
    None disables Faust's web server.
    """
    names = {topic.kind: topic.name for topic in (*INPUT_TOPICS, DEADLETTER, DIAGNOSIS)}
    names.update(topic_names or {})
    app = faust.App(
        app_id,
        broker=broker,
        store="memory://",
        topic_partitions=partitions,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        web_enabled=web_port is not None,
        web_port=web_port or 6066,
        web_bind=web_bind,
        **dict(broker_config or {}),
    )
    deadletters = app.topic(
        names["deadletter"], key_serializer="raw", value_serializer="raw", partitions=partitions
    )
    for topic in INPUT_TOPICS:
        handler = (handlers or {}).get(topic.kind, log_only)
        source = app.topic(
            names[topic.kind], key_serializer="raw", value_serializer="raw", partitions=partitions
        )
        by_record = (record_handlers or {}).get(topic.kind)
        agent = (raw_agents or {}).get(topic.kind) or (
            _decoding_agent(names[topic.kind], topic.kind, handler, deadletters, on_reject)
            if by_record is None
            else record_agent(names[topic.kind], topic.kind, by_record, deadletters, on_reject)
        )
        app.agent(source, name=f"{app_id}.{topic.kind}")(agent)
    return app


def _decoding_agent(
    topic_name: str,
    kind: str,
    handler: Handler,
    deadletters: Any,
    on_reject: Callable[[str, Rejection], None] | None,
) -> Callable[[Any], Awaitable[None]]:
    async def agent(stream: Any) -> None:
        async for key, message, raw in decoded(stream, topic_name, kind, deadletters, on_reject):
            try:
                await handler(key, message)
            except Exception as error:  # noqa: BLE001 - one bad record must not stop the agent
                log.exception("handler for %s failed on a record keyed %s", kind, key)
                await _failed(deadletters, topic_name, key, (message, raw), error, on_reject)

    agent.__name__ = f"decode_{kind}"
    return agent


def record_agent(
    topic_name: str,
    kind: str,
    handler: RecordHandler,
    deadletters: Any,
    on_reject: Callable[[str, Rejection], None] | None,
) -> Callable[[Any], Awaitable[None]]:
    """An agent that hands each record's messages over at once: one await per record, not
    per message (a batch holds tens; each await cost more than a message's detection)."""

    async def agent(stream: Any) -> None:
        async for key, taken in decoded_records(stream, topic_name, kind, deadletters, on_reject):
            try:
                failed = await handler(key, [model for model, _ in taken])
            except Exception as error:  # noqa: BLE001 - one bad record must not stop the agent
                log.exception("handler for %s failed on a record keyed %s", kind, key)
                failed = [(index, error) for index in range(len(taken))]
            for index, cause in failed:
                await _failed(deadletters, topic_name, key, taken[index], cause, on_reject)

    agent.__name__ = f"decode_{kind}"
    return agent


async def _failed(
    deadletters: Any,
    topic_name: str,
    key: str | None,
    taken: tuple[C4Model, bytes | None],
    error: Exception,
    on_reject: Callable[[str, Rejection], None] | None,
) -> None:
    """The dead letter of a message detection failed on: the record's bytes when it was
    the whole record, else the message's own JSON."""
    failure = Rejection(RejectCode.PROCESSING_FAILED, "", f"{type(error).__name__}: {error}")
    if on_reject is not None:
        on_reject(topic_name, failure)
    message, raw = taken
    payload = raw if raw is not None else encode(message)
    await send_dead_letter(deadletters, topic_name, key, payload, failure)

"""Where the torch instrumentation's batches go: a handoff folder the node agent tails
(``c4 agent --handoff``), or Kafka from the training process itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from producers.handoff import FolderSink
from schemas.base import C4Model
from schemas.messages import Collective


def folder_sink(folder: str | Path, name: str) -> Callable[[Iterable[C4Model]], None]:
    """A sink appending JSON lines to ``folder/<name>.jsonl`` for ``c4 agent --handoff``."""
    return FolderSink(Path(folder), name)


def kafka_sink(
    client_config: Mapping[str, Any], topic_prefix: str = "", spool_dir: str | Path | None = None
) -> Callable[[list[Collective]], None]:
    """A sink publishing from the training process itself (spooling to disk while Kafka is away)."""
    from producers.publisher import Publisher
    from producers.spool import DiskSpool

    spool = DiskSpool(Path(spool_dir)) if spool_dir is not None else None
    publisher = Publisher(client_config, topic_prefix, spool)

    class _KafkaSink:
        def __call__(self, messages: list[Collective]) -> None:
            for message in messages:
                publisher.publish(message)
            publisher.service()

        def close(self) -> None:
            publisher.close()

    return _KafkaSink()

"""Offline replay: JSON Lines of v1 messages through a detection stage, in event time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Protocol

from schemas.base import C4Model
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.messages import Diagnosis
from schemas.records import Rejected, decode_record


class Replayed(Protocol):
    """What a replay feeds: a `streams.core.stage.DetectionStage`, or the node and job
    stages of `streams.core.spread`."""

    def on_message(self, message: C4Model) -> list[Diagnosis]:
        """Take one message; the diagnoses that changed."""
        ...

    def on_eof(self) -> list[Diagnosis]:
        """The input ended: the last judgement."""
        ...


@dataclass(slots=True)
class ReplayStats:
    """What a replay read: messages taken, lines rejected, messages behind the clock."""

    messages: int = 0
    rejected: int = 0
    rejections: list[str] = field(default_factory=list)


def replay(
    stage: Replayed,
    lines: Iterable[tuple[int, bytes | None]],
    stats: ReplayStats,
    errors: IO[str] | None = None,
) -> Iterator[Diagnosis]:
    """Decode each numbered line, feed the stage, yield the diagnoses as they change; at
    the end of the input, the stage's last judgement (``on_eof``).

    A line is one message or a batch of them (each counted, and rejected, on its own);
    None stands for a line too long to hold, rejected as a message over the size limit.
    """
    on_message = stage.on_message
    for number, line in kept_lines(lines, stats, errors):
        for message in decoded(number, line, stats, errors):
            yield from on_message(message)
    yield from stage.on_eof()


def kept_lines(
    lines: Iterable[tuple[int, bytes | None]], stats: ReplayStats, errors: IO[str] | None
) -> Iterator[tuple[int, bytes]]:
    """The numbered lines with something on them, stripped; a line too long to hold (None)
    is counted and reported as rejected."""
    for number, raw in lines:
        if raw is None:
            stats.rejected += 1
            if errors is not None:
                errors.write(f"line {number}: line over {MAX_MESSAGE_BYTES} bytes (skipped)\n")
            continue
        line = raw.strip()
        if line:
            yield number, line


def decoded(
    number: int, line: bytes, stats: ReplayStats, errors: IO[str] | None
) -> Iterator[C4Model]:
    """The valid messages of one line, counted; the invalid ones counted and reported."""
    for result in decode_record(line):
        if isinstance(result, Rejected):
            stats.rejected += 1
            if errors is not None:
                errors.write(f"line {number}: {result.reason}\n")
            continue
        stats.messages += 1
        yield result

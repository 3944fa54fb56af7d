"""What every source of the node agent is: a named reader of v1 messages on its own interval.

In the manner of node-problem-detector, a source knows one thing about the node (RDMA
counters, GPU health, a dump folder) and turns what it read into v1 messages; the agent
schedules the sources and hands their messages to the publisher. A source that cannot work
on this node at all (no GPU, no driver) raises `SourceUnavailable` once; a round that
fails raises anything else and the source is tried again next interval. Problems that spoil
only part of a round (one unreadable file) come back as ``problems`` beside the messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from producers import ProducerError
from schemas.base import C4Model


class SourceUnavailable(ProducerError):
    """The source cannot work on this node (missing hardware, driver or library)."""


class SourceFailed(ProducerError):
    """One round of a source failed; it is tried again at its next interval."""


@dataclass(slots=True)
class Reading:
    """What one round of a source produced: messages, and one line per partial problem."""

    messages: list[C4Model] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class Source(Protocol):
    """A reader of one kind of node facts."""

    name: str
    interval_s: float

    def read(self, now_ns: int) -> Reading:
        """One round: the messages of this interval (event time ``now_ns``)."""
        ...

    def close(self) -> None:
        """Release what the source holds (handles, files)."""
        ...

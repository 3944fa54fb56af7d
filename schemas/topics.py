"""The topic registry of contract v1: name, kind, and how each message is keyed."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class KeyRule(StrEnum):
    """Which field of a message is its Kafka key (contract v1, table Topics)."""

    JOB = "job"
    NODE = "node"
    JOB_OR_FABRIC = "job_or_fabric"
    TARGET = "target"
    REJECTED_KEY = "rejected_key"


@dataclass(frozen=True, slots=True)
class Topic:
    """One v1 topic: its name, the kind of message on it and its key rule.

    ``batch_kind`` names the kind that packs several messages of ``kind`` into one record
    (the same topic and key), where the contract has one; ``other_kinds`` are further kinds
    the contract's additions put on the topic, with the same key rule.
    """

    name: str
    kind: str
    key: KeyRule
    written_by: str
    batch_kind: str | None = None
    other_kinds: tuple[str, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind a record of this topic may be."""
        batch = () if self.batch_kind is None else (self.batch_kind,)
        return (self.kind, *batch, *self.other_kinds)


COLLECTIVE = Topic(
    "c4.collective.v1", "collective", KeyRule.JOB, "node agents", batch_kind="collectives"
)
LINK = Topic(
    "c4.link.v1",
    "link",
    KeyRule.NODE,
    "node agents",
    batch_kind="links",
    other_kinds=("neighbours",),
)
GPU = Topic("c4.gpu.v1", "gpu", KeyRule.NODE, "node agents", batch_kind="gpus")
JOB = Topic(
    "c4.job.v1",
    "job",
    KeyRule.JOB,
    "job launchers, restart action, instrumented ranks",
    other_kinds=("member",),
)
DIAGNOSIS = Topic("c4.diagnosis.v1", "diagnosis", KeyRule.JOB_OR_FABRIC, "stream processors")
ACTION = Topic("c4.action.v1", "action", KeyRule.TARGET, "action workers (audit trail)")
ROUTE = Topic("c4.route.v1", "route", KeyRule.NODE, "reroute action")
DEADLETTER = Topic("c4.deadletter.v1", "deadletter", KeyRule.REJECTED_KEY, "whoever rejected it")

ALL_TOPICS: tuple[Topic, ...] = (
    COLLECTIVE,
    LINK,
    GPU,
    JOB,
    DIAGNOSIS,
    ACTION,
    ROUTE,
    DEADLETTER,
)
TOPICS_BY_NAME: dict[str, Topic] = {topic.name: topic for topic in ALL_TOPICS}
TOPICS_BY_KIND: dict[str, Topic] = {kind: topic for topic in ALL_TOPICS for kind in topic.kinds}
# Each batch kind and the topic it packs messages of (whose key is every element's too).
INPUT_BATCHES: dict[str, Topic] = {
    topic.batch_kind: topic for topic in ALL_TOPICS if topic.batch_kind is not None
}

FABRIC_KEY = "fabric"


def reads_as(found: str, expected: str) -> bool:
    """Whether a reader of ``expected`` takes a message of kind ``found``: the same kind, or
    another kind of the same topic. Batches aside: `schemas.records` takes those apart."""
    if found == expected:
        return True
    topic = TOPICS_BY_KIND.get(expected)
    return (
        topic is not None
        and TOPICS_BY_KIND.get(found) is topic
        and topic.batch_kind not in (found, expected)
    )


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The v1 topic names as one deployment spells them: each under ``prefix``.

    The one place a topic prefix (``C4_TOPIC_PREFIX``, e.g. ``staging.``) is put on a name.
    """

    prefix: str = ""

    def of(self, topic: Topic) -> str:
        """A topic's name here."""
        return self.prefix + topic.name

    def of_kind(self, kind: str) -> str:
        """The name of the topic a message kind goes to; KeyError for a kind with none."""
        return self.prefix + TOPICS_BY_KIND[kind].name

    def by_kind(self) -> dict[str, str]:
        """Every topic's name here, by its kind (what the Faust apps take)."""
        return {topic.kind: self.prefix + topic.name for topic in ALL_TOPICS}

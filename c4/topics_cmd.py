"""``c4 topics``: create the v1 topics (idempotent) and list what the broker has."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from c4.topics import TopicError, create_topics, list_topics
from schemas.topics import ALL_TOPICS, TOPICS_BY_NAME, TopicNames

if TYPE_CHECKING:
    from c4.settings import Settings


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "create":
        for name, outcome in create_topics(settings, args.partitions, args.retention_ms):
            print(f"{name} {outcome}")
        return 0
    present = dict(list_topics(settings))
    here = TopicNames(settings.topic_prefix)
    for name, count in present.items():
        marker = " (v1)" if name.removeprefix(here.prefix) in TOPICS_BY_NAME else ""
        print(f"{name} {count} partitions{marker}")
    missing = [here.of(topic) for topic in ALL_TOPICS if here.of(topic) not in present]
    for name in missing:
        print(f"{name} missing (run: c4 topics create)")
    if missing:
        # A script that checks the deployment before it starts workers reads the exit code.
        message = f"{len(missing)} of {len(ALL_TOPICS)} v1 topics missing (run: c4 topics create)"
        raise TopicError(message)
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        message = "must be at least 1"
        raise argparse.ArgumentTypeError(message)
    return value


def _retention(text: str) -> int:
    value = int(text)
    if value < -1:
        message = "must be -1 (forever) or more"
        raise argparse.ArgumentTypeError(message)
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``topics create|list`` subcommand."""
    parser = subparsers.add_parser("topics", help="create the v1 topics or list the broker's")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create the v1 topics (existing ones are kept)")
    create.add_argument(
        "--partitions", type=_positive, help="partitions per topic (env C4_TOPIC_PARTITIONS)"
    )
    create.add_argument(
        "--retention-ms", type=_retention, help="retention.ms (env C4_TOPIC_RETENTION_MS)"
    )
    actions.add_parser("list", help="topics on the broker, and which v1 topics are missing")
    parser.set_defaults(handler=_run)

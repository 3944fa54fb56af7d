"""The ``c4`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from pydantic import ValidationError

from c4 import (
    C4Error,
    actions_cmd,
    agent_cmd,
    convert_cmd,
    dashboard_cmd,
    demo_cmd,
    diagnose_cmd,
    doctor,
    plan_cmd,
    schemas_cmd,
    score_cmd,
    simulate_cmd,
    stack,
    state_cmd,
    streams_cmd,
    topics,
    topology_cmd,
    validate,
)
from c4.security import install_secret_redaction, settings_secrets
from c4.settings import load_settings

SUBCOMMANDS = (
    validate,
    schemas_cmd,
    stack,
    topics,
    doctor,
    streams_cmd,
    diagnose_cmd,
    simulate_cmd,
    score_cmd,
    topology_cmd,
    plan_cmd,
    state_cmd,
    actions_cmd,
    agent_cmd,
    convert_cmd,
    demo_cmd,
    dashboard_cmd,
)


def one_line(text: str) -> str:
    """``text`` with control characters (newlines included) escaped: an error stays one line."""
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose error line never breaks, whatever argv holds."""

    def error(self, message: str) -> NoReturn:
        super().error(one_line(message))


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser: global connection options, then the subcommands."""
    # Subparsers are made of the same class, so every subcommand's errors are one line too.
    parser = OneLineErrorParser(
        prog="c4",
        description="Find the faulty GPU, port, link or switch of a training job; act on it.",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (env C4_KAFKA_BOOTSTRAP)")
    parser.add_argument("--redis-url", help="Redis URL (env C4_REDIS_URL)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; 0 success, 1 failure, 2 usage or configuration error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(kafka_bootstrap=args.bootstrap, redis_url=args.redis_url)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        print(f"c4: error: setting {where}: {one_line(first['msg'])}", file=sys.stderr)
        return 2
    install_secret_redaction(settings_secrets(settings))
    try:
        code: int = args.handler(args, settings)
    except C4Error as error:
        print(f"c4: error: {one_line(str(error))}", file=sys.stderr)
        return int(getattr(error, "exit_code", 1))
    except OSError as error:
        print(
            one_line(f"c4: error: {error.strerror or error}: {error.filename or ''}".rstrip(": ")),
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())

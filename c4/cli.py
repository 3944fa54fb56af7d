"""The ``c4`` command: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from pydantic import ValidationError

from c4 import C4Error
from c4.security import install_secret_redaction, settings_secrets
from c4.settings import load_settings

# Each command's module, imported only when that command runs (or for the full help):
# `c4 diagnose` does not pay for the Faust, Redis and web imports of the workers.
SUBCOMMANDS = {
    "validate": "c4.validate",
    "schemas": "c4.schemas_cmd",
    "stack": "c4.stack",
    "topics": "c4.topics_cmd",
    "doctor": "c4.doctor",
    "streams": "c4.streams_cmd",
    "diagnose": "c4.diagnose_cmd",
    "simulate": "c4.simulate_cmd",
    "score": "c4.score_cmd",
    "topology": "c4.topology_cmd",
    "plan": "c4.plan_cmd",
    "state": "c4.state_cmd",
    "actions": "c4.actions_cmd",
    "agent": "c4.agent_cmd",
    "run": "c4.run_cmd",
    "convert": "c4.convert_cmd",
    "demo": "c4.demo_cmd",
    "dashboard": "c4.dashboard_cmd",
}
GLOBAL_OPTIONS_WITH_VALUE = ("--bootstrap", "--redis-url")


def one_line(text: str) -> str:
    """``text`` with control characters (newlines included) escaped: an error stays one line."""
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def setting_problem(error: ValidationError) -> str:
    """The first problem of the settings (``C4_*``), as one line: ``setting <field>: why``."""
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"setting {where}: {one_line(first['msg'])}"


class OneLineErrorParser(argparse.ArgumentParser):
    """An argument parser whose error line never breaks, whatever argv holds."""

    def error(self, message: str) -> NoReturn:
        super().error(one_line(message))


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (after the global options), None when it names none."""
    words = iter(argv)
    for word in words:
        if word in GLOBAL_OPTIONS_WITH_VALUE:
            next(words, None)
        elif word.startswith("-"):
            continue
        else:
            return word if word in SUBCOMMANDS else None
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser: global connection options, then the subcommands (only the one
    ``argv`` names when it names one: the others' modules are not imported)."""
    # Subparsers are made of the same class, so every subcommand's errors are one line too.
    parser = OneLineErrorParser(
        prog="c4",
        description="Find the faulty GPU, port, link or switch of a training job; act on it.",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (env C4_KAFKA_BOOTSTRAP)")
    parser.add_argument("--redis-url", help="Redis URL (env C4_REDIS_URL)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = _command_in(argv) if argv is not None else None
    for name, module in SUBCOMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; 0 success, 1 failure, 2 usage or configuration error."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(kafka_bootstrap=args.bootstrap, redis_url=args.redis_url)
    except ValidationError as error:
        print(f"c4: error: {setting_problem(error)}", file=sys.stderr)
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
    except (MemoryError, RecursionError) as error:
        # Inputs are bounded before they are read; this is the last guard, not the first.
        print(f"c4: error: input too large or too deep ({type(error).__name__})", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())

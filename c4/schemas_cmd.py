"""``c4 schemas``: write or check the JSON Schema files generated from the models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.jsonschema import SCHEMA_DIR, stale, write_all

if TYPE_CHECKING:
    from c4.settings import Settings


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings
    directory = Path(args.dir)
    if args.action == "write":
        for path in write_all(directory):
            print(path)
        return 0
    outdated = stale(directory)
    for kind in outdated:
        print(f"{kind}: schema file missing or out of date (run: c4 schemas write)")
    if not outdated:
        print("schema files match the models", file=sys.stderr)
    return 1 if outdated else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``schemas write|check`` subcommand."""
    parser = subparsers.add_parser("schemas", help="write or check the JSON Schema files")
    parser.add_argument("action", choices=("write", "check"))
    parser.add_argument("--dir", default=str(SCHEMA_DIR), help="schema folder")
    parser.set_defaults(handler=_run)

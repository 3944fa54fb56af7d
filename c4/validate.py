"""``c4 validate``: check JSON Lines against contract v1, one line per rejected input."""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING

from c4.inputs import json_lines, overlong_line
from schemas.codec import KINDS
from schemas.records import Rejected, decode_record

if TYPE_CHECKING:
    from c4.settings import Settings


def validate_lines(
    stream: IO[bytes], kind: str | None, out: IO[str], name: str = "-"
) -> tuple[int, int]:
    """Print ``line N: <reason>`` for each rejected input; returns (valid, rejected) counts.

    Each message of a batch (``collectives``, ``links``, ``gpus``) counts (and is rejected)
    on its own, as the streams worker takes it: ``line 3: messages[2].rank: 20 >= comm_size
    16``.
    """
    valid = rejected = 0
    for number, raw in json_lines(stream, name):
        if raw is None:
            rejected += 1
            out.write(f"line {number}: {overlong_line()}\n")
            continue
        line = raw.strip()
        if not line:
            continue
        for result in decode_record(line, kind):
            if isinstance(result, Rejected):
                rejected += 1
                out.write(f"line {number}: {result.reason}\n")
            else:
                valid += 1
    return valid, rejected


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # validation is offline: no broker, no Redis
    if args.file == "-":
        valid, rejected = validate_lines(sys.stdin.buffer, args.kind, sys.stdout)
    else:
        with open(args.file, "rb") as stream:
            valid, rejected = validate_lines(stream, args.kind, sys.stdout, args.file)
    print(f"{valid} valid, {rejected} rejected", file=sys.stderr)
    return 0 if rejected == 0 else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``validate`` subcommand."""
    parser = subparsers.add_parser(
        "validate",
        help="check JSON Lines against contract v1",
        description="Print one line per rejected input; exit 0 when all are valid, 1 otherwise.",
    )
    parser.add_argument("--kind", choices=KINDS, help="expected kind (default: each line's own)")
    parser.add_argument("file", nargs="?", default="-", help="JSON Lines file, or - for stdin")
    parser.set_defaults(handler=_run)

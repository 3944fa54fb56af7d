"""``c4 convert``: traces written by other tools as v1 collective messages (JSON Lines)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from c4 import C4Error
from c4.inputs import load_document
from producers.fr_convert import convert
from producers.fr_dump import FlightRecorderError, read_dump_folder
from producers.nccl_inspector import InspectorOp, parse_record, split_objects, to_messages
from schemas.codec import encode
from schemas.messages import Collective, Job, RankPlace

if TYPE_CHECKING:
    from c4.settings import Settings

NS_PER_S = 1_000_000_000


class ConvertError(C4Error):
    """A trace cannot be converted."""


def _placement(path: str | None, job: str | None) -> tuple[str, dict[int, RankPlace]]:
    if path is None:
        if job is None:
            message = "--job is needed when no --placement names the job"
            raise ConvertError(message)
        return job, {}
    placement = load_document(path, "job", Job)
    return job or placement.job, {place.rank: place for place in placement.ranks}


def _write(messages: list[Collective], out: str) -> None:
    data = b"".join(encode(message) + b"\n" for message in messages)
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    else:
        Path(out).write_bytes(data)


def _flight_recorder(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # offline: no broker
    job, places = _placement(args.placement, args.job)
    try:
        dumps = read_dump_folder(Path(args.folder))
        result = convert(dumps, job, places, round(args.interval * NS_PER_S))
    except FlightRecorderError as error:
        raise ConvertError(str(error)) from error
    for line in result.skipped:
        print(f"skipped: {line}", file=sys.stderr)
    _write(result.messages, args.out)
    print(
        f"{len(dumps)} dumps, {len(result.messages)} messages, {len(result.skipped)} skipped",
        file=sys.stderr,
    )
    return 0


def _nccl_inspector(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # offline: no broker
    job, _ = _placement(args.placement, args.job)
    folder = Path(args.folder)
    if not folder.is_dir():
        message = f"{folder}: not a folder"
        raise ConvertError(message)
    ops: list[InspectorOp] = []
    problems: list[str] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        objects, used, errors = split_objects(path.read_text(encoding="utf-8", errors="replace"))
        problems.extend(f"{path}: {error}" for error in errors)
        for obj in objects:
            try:
                ops.append(parse_record(obj))
            except ValueError as error:
                problems.append(f"{path}: record skipped: {error}")
    for line in problems:
        print(f"skipped: {line}", file=sys.stderr)
    messages = to_messages(ops, job, 0)
    messages.sort(key=lambda message: message.ts_ns)
    _write(messages, args.out)
    print(f"{len(ops)} records, {len(messages)} messages", file=sys.stderr)
    return 1 if problems and not ops else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``convert`` subcommand."""
    parser = subparsers.add_parser(
        "convert", help="convert Flight Recorder dumps or NCCL Inspector logs to v1 messages"
    )
    kinds = parser.add_subparsers(dest="trace", required=True, metavar="TRACE")
    fr = kinds.add_parser(
        "flight-recorder",
        help="PyTorch Flight Recorder dumps, one file per rank (name ends with the rank)",
    )
    fr.add_argument("folder", help="folder of dump files")
    fr.add_argument(
        "--interval", type=float, default=1.0, help="reporting interval rebuilt, seconds"
    )
    fr.set_defaults(handler=_flight_recorder)
    inspector = kinds.add_parser("nccl-inspector", help="NCCL Inspector JSON output files")
    inspector.add_argument("folder", help="the inspector's dump folder")
    inspector.set_defaults(handler=_nccl_inspector)
    for sub in (fr, inspector):
        sub.add_argument("--job", help="job id (default: the placement's)")
        sub.add_argument("--placement", help="v1 job message: rank -> node, gpu")
        sub.add_argument("--out", default="-", help="output file, or - for stdout (default)")

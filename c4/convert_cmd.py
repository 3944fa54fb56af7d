"""``c4 convert``: traces written by other tools as v1 collective messages (JSON Lines).

A file that cannot be read is reported on stderr in one line (``error: FILE: why``) and
the others are still converted; the exit code is then 1, and converting nothing at all is
an error. What a readable file holds but cannot be converted is reported as ``skipped:``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from c4 import C4Error
from c4.inputs import load_document
from producers.bounded_read import JsonObjectFile
from producers.fr_convert import convert
from producers.fr_dump import FlightRecorderError, read_dump_folder
from producers.nccl_inspector import InspectorOp, read_records, to_messages
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
    bad_files: list[str] = []
    try:
        dumps = read_dump_folder(Path(args.folder), bad_files)
    except FlightRecorderError as error:
        raise ConvertError(str(error)) from error
    for line in bad_files:
        print(f"error: {line}", file=sys.stderr)
    if not dumps:
        message = f"{args.folder}: none of its {len(bad_files)} dump files could be read"
        raise ConvertError(message)
    result = convert(dumps, job, places, round(args.interval * NS_PER_S))
    for line in result.skipped:
        print(f"skipped: {line}", file=sys.stderr)
    _write(result.messages, args.out)
    unread = f", {len(bad_files)} unreadable" if bad_files else ""
    print(
        f"{len(dumps)} dumps, {len(result.messages)} messages, {len(result.skipped)} skipped"
        f"{unread}",
        file=sys.stderr,
    )
    return 1 if bad_files else 0


def _nccl_inspector(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # offline: no broker
    job, _ = _placement(args.placement, args.job)
    folder = Path(args.folder)
    if not folder.is_dir():
        message = f"{folder}: not a folder"
        raise ConvertError(message)
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    if not paths:
        message = f"{folder}: no files"
        raise ConvertError(message)
    ops: list[InspectorOp] = []
    bad_files = 0
    for path in paths:
        file_ops, unreadable, skipped = read_records(JsonObjectFile(path), final=True)
        ops.extend(file_ops)
        # What cannot be read as JSON makes the file bad; a record that is JSON but not one
        # to convert (a point-to-point one, say) is only skipped.
        bad_files += bool(unreadable)
        for line in unreadable:
            print(f"error: {line}", file=sys.stderr)
        for line in skipped:
            print(f"skipped: {line}", file=sys.stderr)
    if not ops:
        message = f"{folder}: no NCCL Inspector record could be converted from {len(paths)} files"
        raise ConvertError(message)
    messages = to_messages(ops, job, 0)
    messages.sort(key=lambda message: message.ts_ns)
    _write(messages, args.out)
    unread = f", {bad_files} files with unreadable content" if bad_files else ""
    print(f"{len(ops)} records, {len(messages)} messages{unread}", file=sys.stderr)
    return 1 if bad_files else 0


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

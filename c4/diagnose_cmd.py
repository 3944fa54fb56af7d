"""``c4 diagnose``: replay v1 messages in event time and print v1 diagnoses."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from c4.gc_tuning import no_collections
from c4.inputs import InputError, json_lines, load_document, load_params, overlong_line
from c4.progress import ReadProgress
from schemas.base import C4Model
from schemas.codec import Rejection, decode, encode
from schemas.files import Topology
from streams.core.engine import Engine
from streams.core.params import DetectorParams
from streams.core.spread import SpreadDetection
from streams.replay import Replayed, ReplayStats, replay

# Node stages in one process, and worker processes: far more than a replay can use.
MAX_NODE_STAGES = 1024
MAX_WORKERS = 256

if TYPE_CHECKING:
    from c4.settings import Settings
    from streams.spread_replay import SpreadReplay


def load_placements(stage: Replayed, path: str) -> None:
    """Feed the stage a file of job (or member) messages; bad lines are reported and
    skipped, and a file of which none is valid is an `InputError`."""
    taken = rejected = 0
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below, after the reading
    except OSError as error:
        message = f"cannot read {path}: {error.strerror or error}"
        raise InputError(message, 2) from None
    with stream:
        for number, raw in json_lines(stream, path):
            if raw is not None and not raw.strip():
                continue
            job = decode(raw, "job") if raw is not None else None
            if not isinstance(job, C4Model):
                rejected += 1
                reason = job.reason if isinstance(job, Rejection) else overlong_line()
                print(f"{path} line {number}: {reason}", file=sys.stderr)
                continue
            taken += 1
            stage.on_message(job)  # a placement, or a rank's member report
    if rejected and not taken:
        message = f"{path}: no valid job message ({rejected} rejected)"
        raise InputError(message)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # an offline replay: no broker, no Redis
    topology = load_document(args.topology, "topology", Topology) if args.topology else None
    params, job_params = load_params(args.params) if args.params else (DetectorParams(), {})
    engine = Engine(params, job_params, topology)
    stage: Replayed = engine
    spread: SpreadReplay | None = None
    if args.workers:
        # Imported here: multiprocessing is paid for only by the replays that use it.
        from streams.spread_replay import SpreadReplay

        stage = spread = SpreadReplay(engine, args.workers)
    elif args.node_stages:
        stage = SpreadDetection(engine, args.node_stages)
    stats = ReplayStats()
    if args.jobs:
        load_placements(stage, args.jobs)
    out = sys.stdout.buffer
    stream = sys.stdin.buffer if args.file == "-" else Path(args.file).open("rb")  # noqa: SIM115
    with stream, no_collections(), ReadProgress(stream, "diagnose", sys.stderr) as progress:
        lines = json_lines(progress.source, args.file)
        found = (
            replay(stage, lines, stats, progress.messages)
            if spread is None
            else spread.run(lines, stats, progress.messages)
        )
        for diagnosis in found:
            with progress.above(sys.stdout):
                out.write(encode(diagnosis) + b"\n")
    out.flush()
    if stats.rejected and not stats.messages:
        # Nothing was diagnosed: "no finding" would be a claim about no data.
        message = f"every message of {args.file} was rejected ({stats.rejected})"
        print(f"c4 diagnose: error: {message}", file=sys.stderr)
        return 1
    print(f"{stats.messages} messages, {stats.rejected} rejected", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``diagnose`` subcommand."""
    parser = subparsers.add_parser(
        "diagnose", help="replay v1 messages through the detectors; print v1 diagnoses"
    )
    parser.add_argument("--topology", help="v1 topology file (enables the fabric correlator)")
    parser.add_argument("--jobs", help="JSON Lines of v1 job messages (placements)")
    parser.add_argument("--params", help='detector parameters: {"defaults": {}, "jobs": {}}')
    parser.add_argument(
        "--node-stages",
        type=_count(MAX_NODE_STAGES),
        default=0,
        metavar="N",
        help="take the collective reports in N node stages that hand each operation's parts"
        " to the job stage at barriers, as a job spread over workers is read (default: one"
        " detector takes every report)",
    )
    parser.add_argument(
        "--workers",
        type=_count(MAX_WORKERS),
        default=0,
        metavar="N",
        help="the node stages in N worker processes, the job stage in this one: a large"
        " job's replay on N more cores, the same findings (overrides --node-stages)",
    )
    parser.add_argument("file", nargs="?", default="-", help="JSON Lines of v1 messages, or -")
    parser.set_defaults(handler=_run)


def _count(most: int) -> Callable[[str], int]:
    """A whole number from 1 to ``most``: stages and processes are made up front, so an
    unbounded count would take the machine's memory before the first line is read."""

    def parsed(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            message = f"not a whole number: {text!r}"
            raise argparse.ArgumentTypeError(message) from None
        if not 1 <= value <= most:
            message = f"must be from 1 to {most}, not {value}"
            raise argparse.ArgumentTypeError(message)
        return value

    return parsed

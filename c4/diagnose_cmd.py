"""``c4 diagnose``: replay v1 messages in event time and print v1 diagnoses."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from c4.inputs import load_document, load_params, read_input
from schemas.codec import Rejection, decode, encode
from schemas.files import Topology
from streams.core.engine import Engine
from streams.core.params import DetectorParams
from streams.replay import ReplayStats, replay

if TYPE_CHECKING:
    from c4.settings import Settings


REPLAY_GC_THRESHOLD = 50_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Python's cyclic collector, run less often while a replay allocates.

    A replay makes millions of small objects that die young and hold no cycles (operation
    states, tuples, decoded messages); at the default threshold (700 allocations) the
    collector runs every few messages and walks everything the detectors hold, 6-8% of a
    replay here. What was imported before is frozen out of its scans.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(REPLAY_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # an offline replay: no broker, no Redis
    topology = load_document(args.topology, "topology", Topology) if args.topology else None
    params, job_params = load_params(args.params) if args.params else (DetectorParams(), {})
    engine = Engine(params, job_params, topology)
    stats = ReplayStats()
    if args.jobs:
        for number, raw in enumerate(read_input(args.jobs).splitlines(), start=1):
            if not raw.strip():
                continue
            job = decode(raw, "job")
            if isinstance(job, Rejection):
                print(f"{args.jobs} line {number}: {job.reason}", file=sys.stderr)
                continue
            engine.process(job)  # a placement, or a rank's member report
    out = sys.stdout.buffer
    stream = sys.stdin.buffer if args.file == "-" else Path(args.file).open("rb")  # noqa: SIM115
    with stream, fewer_collections():
        for diagnosis in replay(engine, stream, stats, sys.stderr):
            out.write(encode(diagnosis) + b"\n")
    out.flush()
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
    parser.add_argument("file", nargs="?", default="-", help="JSON Lines of v1 messages, or -")
    parser.set_defaults(handler=_run)

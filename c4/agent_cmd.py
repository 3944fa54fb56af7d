"""``c4 agent``: the node agent: every configured source on its interval, to Kafka.

``--once --print`` runs one round of every source and prints the messages as JSON Lines
instead of publishing them (for checking a node by hand). Otherwise messages go to Kafka
through the spooling publisher: nothing is lost while the broker is away (up to the
spool's bound, heartbeats dropped first), and the counts are reported on stderr.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from c4 import C4Error
from producers.agent import Agent
from producers.flight_recorder import FlightRecorderSource
from producers.handoff import HandoffSource
from producers.nccl_inspector import InspectorSource
from producers.nvml import NvmlSource
from producers.publisher import DeliveryCounts, Publisher
from producers.sources import Source
from producers.spool import DiskSpool, SpoolError
from producers.sysfs import SysfsSource
from schemas.base import C4Model
from schemas.codec import encode

if TYPE_CHECKING:
    from c4.settings import Settings

REPORT_EVERY_S = 60.0
TROUBLE_EVERY_S = 5.0


class AgentError(C4Error):
    """The agent's configuration is unusable."""


def build_sources(args: argparse.Namespace) -> list[Source]:
    """The sources the arguments configure."""
    node = args.node or socket.gethostname()
    sources: list[Source] = []
    if not args.no_sysfs:
        interfaces = frozenset(args.net_if) if args.net_if else None
        sources.append(SysfsSource(node, Path(args.sysfs_root), args.link_interval, interfaces))
    if not args.no_nvml:
        sources.append(NvmlSource(node, args.gpu_interval))
    needs_job = [
        flag
        for flag, value in (("--inspector-dir", args.inspector_dir), ("--fr-dir", args.fr_dir))
        if value
    ]
    if needs_job and not args.job:
        message = f"{', '.join(needs_job)} needs --job"
        raise AgentError(message)
    if args.inspector_dir:
        sources.append(InspectorSource(Path(args.inspector_dir), args.job, node, args.interval))
    if args.fr_dir:
        sources.append(FlightRecorderSource(Path(args.fr_dir), args.job, args.interval))
    if args.handoff:
        checkpoint = Path(args.handoff_state) if args.handoff_state else None
        sources.append(HandoffSource(Path(args.handoff), args.interval, checkpoint=checkpoint))
    return sources


def _handoffs(sources: list[Source]) -> list[HandoffSource]:
    return [source for source in sources if isinstance(source, HandoffSource)]


def _commit(handoff: HandoffSource) -> None:
    problem = handoff.commit()
    if problem is not None:
        _report(f"source {handoff.name}: {problem}")


def _report(line: str) -> None:
    print(f"c4 agent: {line}", file=sys.stderr, flush=True)


def _summary(counts: DeliveryCounts) -> str:
    return (
        f"delivered {counts.delivered}, failed {counts.failed}, outages {counts.outages}, "
        f"spooled {counts.spooled}, replayed {counts.replayed}, "
        f"dropped heartbeats {counts.dropped_heartbeats}, dropped others {counts.dropped_records}"
    )


def _printer(message: C4Model) -> None:
    sys.stdout.buffer.write(encode(message) + b"\n")
    sys.stdout.flush()


def _run(args: argparse.Namespace, settings: Settings) -> int:
    spool_dir = Path(args.spool_dir) if args.spool_dir else settings.stack_dir / "agent-spool"
    if args.handoff and not args.print and not args.handoff_state:
        # Read positions kept beside the spool: a restarted agent goes on where it was.
        args.handoff_state = str(spool_dir / "handoff-offsets.json")
    sources = build_sources(args)
    handoffs = _handoffs(sources)
    publisher: Publisher | None = None
    if not args.print:
        try:
            spool = DiskSpool(spool_dir, max_bytes=args.spool_max_mb << 20)
        except SpoolError as error:
            raise AgentError(str(error)) from error
        publisher = Publisher(settings.kafka_client_config(), settings.topic_prefix, spool)
        _report(f"publishing to {settings.kafka_bootstrap}; spool {spool_dir}")
    agent = Agent(
        sources,
        _printer if publisher is None else publisher.publish,
        _report,
        pack=args.batch,
        node=args.node or socket.gethostname(),
    )
    stop = {"now": False}

    def _stop(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    started = last_report = time.monotonic()
    last_trouble = (0, 0, 0)
    try:
        while not stop["now"]:
            if args.once:
                count = agent.run_once()
                _report(f"{count} messages from {', '.join(agent.active) or 'no source'}")
                break
            wait = agent.step()
            now = time.monotonic()
            if publisher is not None:
                publisher.service()
                if publisher.in_flight() == 0:
                    # Everything read so far is acknowledged or in the spool.
                    for handoff in handoffs:
                        _commit(handoff)
                counts = publisher.counts
                trouble = (counts.outages, counts.dropped_heartbeats, counts.dropped_records)
                # Outages and drops are told at once (at most every few seconds), the rest
                # once a minute.
                if now - last_report >= REPORT_EVERY_S or (
                    trouble != last_trouble and now - last_report >= TROUBLE_EVERY_S
                ):
                    _report(_summary(counts) + (" (broker unreachable)" if publisher.down else ""))
                    last_report, last_trouble = now, trouble
            if args.duration and now - started >= args.duration:
                break
            time.sleep(min(wait, 0.1))
    except KeyboardInterrupt:
        pass
    finally:
        agent.close()
        if publisher is not None:
            left = publisher.close(args.drain_s)
            for handoff in handoffs:  # what was not delivered is in the spool now
                _commit(handoff)
            _report(f"{_summary(publisher.counts)}; {left} not yet delivered (kept in the spool)")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``agent`` subcommand."""
    parser = subparsers.add_parser(
        "agent", help="the node agent: sysfs, NVML, NCCL Inspector, Flight Recorder -> Kafka"
    )
    parser.add_argument("--node", help="this node's id (default: the host name)")
    parser.add_argument("--job", help="job id for the inspector and Flight Recorder sources")
    parser.add_argument("--sysfs-root", default="/sys", help="sysfs root (default /sys)")
    parser.add_argument("--net-if", action="append", help="Ethernet interface to report")
    parser.add_argument("--no-sysfs", action="store_true", help="no link counters")
    parser.add_argument("--no-nvml", action="store_true", help="no GPU health")
    parser.add_argument("--inspector-dir", help="NCCL Inspector dump folder to tail")
    parser.add_argument("--fr-dir", help="Flight Recorder dump folder to watch")
    parser.add_argument("--handoff", help="folder the torch instrumentation writes to")
    parser.add_argument(
        "--handoff-state",
        help="file keeping the handoff read positions (default <spool dir>/handoff-offsets.json)",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="collective sources, s")
    parser.add_argument(
        "--batch",
        action="store_true",
        help="each round's collective messages as one collectives record per job (one "
        "streams worker only: see docs/guarantees.md)",
    )
    parser.add_argument("--link-interval", type=float, default=1.0, help="sysfs, s")
    parser.add_argument("--gpu-interval", type=float, default=5.0, help="NVML, s")
    parser.add_argument("--spool-dir", help="disk spool (default <stack dir>/agent-spool)")
    parser.add_argument("--spool-max-mb", type=int, default=256, help="spool bound, MiB")
    parser.add_argument("--drain-s", type=float, default=10.0, help="delivery wait at exit, s")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--once", action="store_true", help="one round of every source")
    parser.add_argument("--print", action="store_true", help="JSON Lines to stdout, not Kafka")
    parser.set_defaults(handler=_run)

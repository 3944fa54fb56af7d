"""``c4 agent``: the node agent: every configured source on its interval, to Kafka.

GPU health and port counters come from NVML and sysfs, or from exporters the cluster already
runs: ``--dcgm-url`` (dcgm-exporter) instead of NVML, ``--node-exporter-url`` (node_exporter's
InfiniBand collector) instead of sysfs, or ``--prometheus-url`` (both, through a Prometheus
server) instead of either; ``--nvml`` / ``--sysfs`` keep the replaced source on as well.
``--lldp`` adds each port's LLDP neighbour (lldpd's), from which miscabled ports are found.

``--once --print`` runs one round of every source and prints the messages as JSON Lines
instead of publishing them (for checking a node by hand). Otherwise messages go to Kafka
through the spooling publisher: nothing is lost while the broker is away (up to the
spool's bound, heartbeats dropped first), and the counts are reported on stderr.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from c4 import C4Error
from c4.stopping import stop_on_signals
from producers.agent import Agent
from producers.agent_loop import (
    RunLimits,
    handoff_state_beside,
    handoffs_of,
    run_agent,
    spooling_publisher,
)
from producers.exporters import (
    DEFAULT_DCGM_URL,
    DEFAULT_NODE_EXPORTER_URL,
    DEFAULT_TIMEOUT_S,
    DcgmExporterSource,
    NodeExporterSource,
    PrometheusGpuSource,
    PrometheusLinkSource,
    check_url,
)
from producers.flight_recorder import FlightRecorderSource
from producers.handoff import HandoffSource
from producers.lldp import LldpSource
from producers.nccl_inspector import InspectorSource
from producers.nvml import NvmlSource
from producers.publisher import Publisher
from producers.sources import Source, SourceUnavailable
from producers.spool import SpoolError
from producers.sysfs import SysfsSource
from schemas.base import C4Model
from schemas.codec import encode

if TYPE_CHECKING:
    from c4.settings import Settings


class AgentError(C4Error):
    """The agent's configuration is unusable."""


class AgentOptionError(AgentError):
    """Options that do not go together, or a value that cannot be used (a usage error)."""

    exit_code = 2


def _seconds(text: str) -> float:
    """A duration in seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        message = f"expected seconds (0 or more), got {text!r}"
        raise argparse.ArgumentTypeError(message)
    return value


def _check_exporter_options(args: argparse.Namespace) -> None:
    """Validate the exporter URLs (in place: a bare host gets its default path) and the
    options that go with them; AgentOptionError, one line, otherwise."""
    for flag, attribute, path in (
        ("--dcgm-url", "dcgm_url", "/metrics"),
        ("--node-exporter-url", "node_exporter_url", "/metrics"),
        ("--prometheus-url", "prometheus_url", ""),
    ):
        value = getattr(args, attribute)
        if value is not None:
            try:
                setattr(args, attribute, check_url(value, flag, default_path=path))
            except ValueError as error:
                raise AgentOptionError(str(error)) from None
    if args.prometheus_url and (args.dcgm_url or args.node_exporter_url):
        message = "--prometheus-url reads both exporters: leave out --dcgm-url/--node-exporter-url"
        raise AgentOptionError(message)
    if args.prometheus_all_nodes and not args.prometheus_url:
        message = "--prometheus-all-nodes needs --prometheus-url"
        raise AgentOptionError(message)
    if not math.isfinite(args.exporter_timeout) or args.exporter_timeout <= 0:
        message = f"--exporter-timeout must be more than 0 s, got {args.exporter_timeout}"
        raise AgentOptionError(message)
    for on, off in (("sysfs", "no_sysfs"), ("nvml", "no_nvml")):
        if getattr(args, on) and getattr(args, off):
            message = f"--{on} and --{off.replace('_', '-')} contradict each other"
            raise AgentOptionError(message)


def _hardware_sources(args: argparse.Namespace, node: str) -> list[Source]:
    """GPU health and port counters: NVML and sysfs, or the exporters replacing them."""
    interfaces = frozenset(args.net_if) if args.net_if else None
    timeout = args.exporter_timeout
    sources: list[Source] = []
    links_elsewhere = bool(args.node_exporter_url or args.prometheus_url)
    gpus_elsewhere = bool(args.dcgm_url or args.prometheus_url)
    if not args.no_sysfs and (args.sysfs or not links_elsewhere):
        sources.append(SysfsSource(node, Path(args.sysfs_root), args.link_interval, interfaces))
    if not args.no_nvml and (args.nvml or not gpus_elsewhere):
        sources.append(NvmlSource(node, args.gpu_interval))
    if args.node_exporter_url:
        sources.append(
            NodeExporterSource(
                node,
                args.node_exporter_url,
                args.link_interval,
                timeout,
                net_interfaces=interfaces or frozenset(),
            )
        )
    if args.dcgm_url:
        sources.append(DcgmExporterSource(node, args.dcgm_url, args.gpu_interval, timeout))
    if args.prometheus_url:
        only = None if args.prometheus_all_nodes else node
        sources.append(
            PrometheusLinkSource(
                args.prometheus_url,
                only,
                args.link_interval,
                timeout,
                net_interfaces=interfaces or frozenset(),
            )
        )
        sources.append(PrometheusGpuSource(args.prometheus_url, only, args.gpu_interval, timeout))
    return sources


def build_sources(args: argparse.Namespace) -> list[Source]:
    """The sources the arguments configure."""
    _check_exporter_options(args)
    node = args.node or socket.gethostname()
    sources = _hardware_sources(args, node)
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
    if args.lldp:
        try:
            lldp = LldpSource(node, args.lldp_interval, Path(args.sysfs_root), args.lldp_socket)
        except SourceUnavailable as error:
            raise AgentError(str(error)) from None
        sources.append(lldp)
    return sources


def _report(line: str) -> None:
    print(f"c4 agent: {line}", file=sys.stderr, flush=True)


def _printer(message: C4Model) -> None:
    sys.stdout.buffer.write(encode(message) + b"\n")
    sys.stdout.flush()


def _run(args: argparse.Namespace, settings: Settings) -> int:
    spool_dir = Path(args.spool_dir) if args.spool_dir else settings.deployment_dir / "agent-spool"
    if args.handoff and not args.print and not args.handoff_state:
        args.handoff_state = str(handoff_state_beside(spool_dir))
    sources = build_sources(args)
    publisher: Publisher | None = None
    if not args.print:
        try:
            publisher = spooling_publisher(
                settings.kafka_client_config(),
                settings.topic_prefix,
                spool_dir,
                args.spool_max_mb << 20,
            )
        except SpoolError as error:
            raise AgentError(str(error)) from error
        _report(f"publishing to {settings.kafka_bootstrap}; spool {spool_dir}")
    agent = Agent(
        sources,
        _printer if publisher is None else publisher.publish,
        _report,
        pack=args.batch,
        node=args.node or socket.gethostname(),
        presence_s=args.presence_s,
    )
    limits = RunLimits(once=args.once, duration_s=args.duration, drain_s=args.drain_s)
    with stop_on_signals() as stop:
        run_agent(agent, publisher, handoffs_of(sources), _report, stop, limits)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``agent`` subcommand."""
    parser = subparsers.add_parser(
        "agent",
        help="the node agent: sysfs or node_exporter, NVML or dcgm-exporter, NCCL Inspector, "
        "Flight Recorder -> Kafka",
    )
    parser.add_argument("--node", help="this node's id (default: the host name)")
    parser.add_argument("--job", help="job id for the inspector and Flight Recorder sources")
    parser.add_argument("--sysfs-root", default="/sys", help="sysfs root (default /sys)")
    parser.add_argument("--net-if", action="append", help="Ethernet interface to report")
    parser.add_argument("--no-sysfs", action="store_true", help="no link counters from sysfs")
    parser.add_argument("--no-nvml", action="store_true", help="no GPU health from NVML")
    exporters = parser.add_argument_group(
        "exporters",
        "GPU health and port counters from exporters the cluster already runs, in the units "
        "of the NVML and sysfs sources (docs/exporters.md). An exporter replaces the source "
        "it stands for, unless --nvml/--sysfs keeps it on.",
    )
    exporters.add_argument(
        "--dcgm-url",
        nargs="?",
        const=DEFAULT_DCGM_URL,
        metavar="URL",
        help=f"gpu messages from dcgm-exporter instead of NVML (without URL: {DEFAULT_DCGM_URL})",
    )
    exporters.add_argument(
        "--node-exporter-url",
        nargs="?",
        const=DEFAULT_NODE_EXPORTER_URL,
        metavar="URL",
        help="link messages from node_exporter's InfiniBand collector (and, for the --net-if "
        f"interfaces, node_network_*) instead of sysfs (without URL: {DEFAULT_NODE_EXPORTER_URL})",
    )
    exporters.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="both, from the dcgm-exporter and node_exporter series a Prometheus server holds "
        "(its /api/v1/query): this node's, matched by the Hostname label and the instance host",
    )
    exporters.add_argument(
        "--prometheus-all-nodes",
        action="store_true",
        help="with --prometheus-url: every node's messages (one collector per cluster), each "
        "named by its series' Hostname label or instance host",
    )
    exporters.add_argument(
        "--exporter-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"HTTP timeout of each scrape or query, s (default {DEFAULT_TIMEOUT_S:g})",
    )
    exporters.add_argument(
        "--sysfs", action="store_true", help="read sysfs too, beside an exporter's link messages"
    )
    exporters.add_argument(
        "--nvml", action="store_true", help="read NVML too, beside an exporter's gpu messages"
    )
    parser.add_argument(
        "--lldp",
        action="store_true",
        help="report each port's LLDP neighbour (lldpd's lldpcli): miscabled ports are found",
    )
    parser.add_argument(
        "--lldp-interval", type=_seconds, default=60.0, help="LLDP neighbours, s (60)"
    )
    parser.add_argument("--lldp-socket", help="lldpd's control socket (lldpcli -u)")
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
        help="each round's collective messages as one collectives record per job, its link "
        "and GPU messages as one links and one gpus record (one streams worker only: see "
        "docs/guarantees.md)",
    )
    parser.add_argument(
        "--presence-s",
        type=_seconds,
        default=300.0,
        help="while a job's ranks here are silent, say this node is up for this long, s (0: never)",
    )
    parser.add_argument("--link-interval", type=float, default=1.0, help="sysfs / node_exporter, s")
    parser.add_argument("--gpu-interval", type=float, default=5.0, help="NVML / dcgm-exporter, s")
    parser.add_argument(
        "--spool-dir", help="disk spool (default <deployment dir>/agent-spool, see C4_DEPLOYMENT)"
    )
    parser.add_argument("--spool-max-mb", type=int, default=256, help="spool bound, MiB")
    parser.add_argument("--drain-s", type=float, default=10.0, help="delivery wait at exit, s")
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--once", action="store_true", help="one round of every source")
    parser.add_argument("--print", action="store_true", help="JSON Lines to stdout, not Kafka")
    parser.set_defaults(handler=_run)

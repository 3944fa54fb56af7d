"""``c4 topology import``: the real fabric's v1 topology from what operators already run.

ibnetdiscover (InfiniBand), ``lldpcli -f json show neighbors`` per node (RoCE, Ethernet) or
Slurm's topology.conf (``topology.fabric`` holds what they share). The topology written is
what the importer found, nothing guessed beyond the tiers: a switch with node ports is a
leaf, one cabled to a leaf a spine. ``c4 topology diff`` compares two topologies.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from c4 import C4Error
from c4.inputs import MAX_DOCUMENT_BYTES, load_document, read_input
from c4.outputs import write_output
from producers.hostlist import expand_hostlist
from schemas.codec import encode
from schemas.files import Topology
from topology import TopologyError
from topology.drift import topology_changes
from topology.fabric import FabricFacts, build_topology
from topology.ibnetdiscover import Defaults, parse_ibnetdiscover
from topology.lldp import parse_lldp_dir
from topology.name_map import NO_RENAMES, NameMap, parse_name_map
from topology.slurm_topology import SLURM_PORT, parse_slurm_topology

if TYPE_CHECKING:
    from c4.settings import Settings


def _text(path: str) -> str:
    """A text input, ``-`` being stdin; `InputError` (one line) when it cannot be read."""
    if path == "-":
        data = sys.stdin.buffer.read(MAX_DOCUMENT_BYTES + 1)
        if len(data) > MAX_DOCUMENT_BYTES:
            message = f"stdin: larger than {MAX_DOCUMENT_BYTES} bytes"
            raise C4Error(message)
    else:
        data = read_input(path)
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        message = f"{path}: not UTF-8 text (byte {error.start})"
        raise C4Error(message) from None


def _facts(args: argparse.Namespace, names: NameMap) -> FabricFacts:
    if args.ibnetdiscover is not None:
        source = "stdin" if args.ibnetdiscover == "-" else args.ibnetdiscover
        defaults = Defaults(port_gbps=args.port_gbps, uplink_gbps=args.uplink_gbps)
        return parse_ibnetdiscover(_text(args.ibnetdiscover), source, names, defaults)
    if args.lldp is not None:
        return parse_lldp_dir(Path(args.lldp), names, args.port_gbps, args.uplink_gbps)
    text = _text(args.slurm_conf)
    facts = parse_slurm_topology(
        text, args.slurm_conf, expand_hostlist, names, args.port_gbps, args.uplink_gbps
    )
    print(
        f"c4: note: topology.conf names no ports: each node gets one port {SLURM_PORT!r} "
        "on its leaf (per node, not per NIC)",
        file=sys.stderr,
    )
    return facts


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # offline: no broker, no Redis
    for option, value in (("--port-gbps", args.port_gbps), ("--uplink-gbps", args.uplink_gbps)):
        if not value > 0:
            print(f"c4: error: {option} must be a positive number, got {value}", file=sys.stderr)
            return 2
    try:
        names = parse_name_map(_text(args.map), args.map) if args.map else NO_RENAMES
        imported = build_topology(_facts(args, names), args.gpus)
    except (C4Error, TopologyError) as error:
        print(f"c4: error: {error}", file=sys.stderr)
        return 2
    for note in imported.notes:
        print(f"c4: note: {note} (a v1 topology has two tiers)", file=sys.stderr)
    return write_output(args.out, encode(imported.topology) + b"\n")


def add_import_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``topology import``."""
    parser = actions.add_parser(
        "import",
        help="write the real fabric's v1 topology from ibnetdiscover, LLDP or topology.conf",
        description=(
            "Leaves are the switches with node ports, spines the switches cabled to leaves; what "
            "two tiers cannot hold is left out and said on stderr. Malformed input is one line "
            "naming the file and line, exit 2."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--ibnetdiscover",
        metavar="FILE",
        help="ibnetdiscover's topology file, or - for stdin (HCAs named '<host> <device>')",
    )
    source.add_argument(
        "--lldp",
        metavar="DIR",
        help="a folder of 'lldpcli -f json show neighbors' files, one per node (<node>.json)",
    )
    source.add_argument(
        "--slurm-conf", metavar="FILE", help="Slurm's topology.conf (topology/tree plugin)"
    )
    parser.add_argument(
        "--map",
        metavar="FILE",
        help="renames, one 'FROM TO' a line (GUID, description, host or interface name)",
    )
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument(
        "--port-gbps",
        type=float,
        default=200.0,
        help="a node port's speed when the input gives none (200)",
    )
    parser.add_argument(
        "--uplink-gbps",
        type=float,
        default=400.0,
        help="a switch-to-switch cable's speed when the input gives none (400)",
    )
    parser.add_argument("--out", default="-", help="output file, or - for stdout (default)")
    parser.set_defaults(handler=_run)


def _diff(args: argparse.Namespace, settings: Settings) -> int:
    del settings
    try:
        old = load_document(args.old, "topology", Topology)
        new = load_document(args.new, "topology", Topology)
    except C4Error as error:
        print(f"c4: error: {error}", file=sys.stderr)
        return 2
    changes = topology_changes(old, new)
    sys.stdout.write("".join(change.line() + "\n" for change in changes))
    return 1 if changes else 0


def add_diff_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``topology diff``."""
    parser = actions.add_parser(
        "diff",
        help="print moved cables, missing ports and new switches between two topologies",
        description="One line per change. Exit 0: the same, 1: they differ, 2: bad input.",
    )
    parser.add_argument("old", help="the topology as it was (v1 file)")
    parser.add_argument("new", help="the topology as it is (v1 file)")
    parser.set_defaults(handler=_diff)

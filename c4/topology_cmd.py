"""``c4 topology gen``: write a standard leaf-spine fabric as a v1 topology file;
``c4 topology slurm-conf``: Slurm's topology.conf from one; ``import`` and ``diff`` are in
`c4.topology_import`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from c4 import C4Error
from c4.inputs import load_document
from c4.outputs import write_output
from c4.topology_import import add_diff_parser, add_import_parser
from schemas.codec import encode
from schemas.files import Topology
from topology.generate import DEFAULT_NODES_PER_LEAF, Shape, ShapeError, generate
from topology.slurm_conf import render_topology_conf

if TYPE_CHECKING:
    from c4.settings import Settings


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # offline: no broker, no Redis
    shape = Shape(
        nodes=args.nodes,
        spines=args.spines,
        nics=args.nics,
        planes=args.planes,
        leaves_per_plane=args.leaves_per_plane,
        nodes_per_leaf=args.nodes_per_leaf,
        port_gbps=args.port_gbps,
        uplink_gbps=args.uplink_gbps,
        gpus=args.gpus,
    )
    try:
        data = encode(generate(shape)) + b"\n"
    except ShapeError as error:
        print(f"c4: error: {error}", file=sys.stderr)
        return 2
    return write_output(args.out, data)


def _slurm_conf(args: argparse.Namespace, settings: Settings) -> int:
    del settings
    try:
        topology = load_document(args.topology, "topology", Topology)
    except C4Error as error:
        print(f"c4: error: {error}", file=sys.stderr)
        return 2
    return write_output(args.out, render_topology_conf(topology).encode())


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``topology`` subcommands: gen, slurm-conf, import, diff."""
    parser = subparsers.add_parser(
        "topology", help="generate, import and compare fabric topologies"
    )
    actions = parser.add_subparsers(dest="topology_command", required=True, metavar="ACTION")
    gen = actions.add_parser(
        "gen",
        help="write a 2-tier leaf-spine fabric as a v1 topology",
        description=(
            "Nodes with dual-port NICs, each port on its own leaf (port 1 in plane a, port 2 in "
            "plane b with --planes 2); every leaf linked to every spine of its plane."
        ),
    )
    gen.add_argument("--nodes", type=int, required=True, help="number of nodes")
    gen.add_argument("--spines", type=int, required=True, help="spines per plane")
    gen.add_argument("--nics", type=int, default=8, help="dual-port NICs per node (default 8)")
    gen.add_argument("--planes", type=int, default=2, help="1 or 2 (default 2)")
    gen.add_argument("--leaves-per-plane", type=int, help="default: as many as the nodes need")
    gen.add_argument(
        "--nodes-per-leaf",
        type=int,
        help=f"nodes whose ports share a leaf (default {DEFAULT_NODES_PER_LEAF}, or derived "
        "from --leaves-per-plane)",
    )
    gen.add_argument("--port-gbps", type=float, default=200.0, help="NIC port speed (200)")
    gen.add_argument("--uplink-gbps", type=float, default=400.0, help="leaf-spine speed (400)")
    gen.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    gen.add_argument("--out", default="-", help="output file, or - for stdout (default)")
    gen.set_defaults(handler=_run)
    conf = actions.add_parser(
        "slurm-conf",
        help="write Slurm's topology.conf (topology/tree) from a v1 topology",
        description=(
            "One line per leaf with its nodes, per spine with its leaves: Slurm's topology-aware "
            "placement then keeps a job's nodes under few leaves."
        ),
    )
    conf.add_argument("--topology", required=True, help="v1 topology file")
    conf.add_argument("--out", default="-", help="output file, or - for stdout (default)")
    conf.set_defaults(handler=_slurm_conf)
    add_import_parser(actions)
    add_diff_parser(actions)

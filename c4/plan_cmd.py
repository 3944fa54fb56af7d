"""``c4 plan``: plan the paths of a flows file on a topology; print the v1 plan.

With ``--hash MODEL`` each path also carries ``sport``, the UDP source port that makes the
source leaf's hash choose the planned spine; the document stays a valid v1 plan (readers
ignore unknown keys).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from c4.inputs import load_document
from c4.outputs import write_output
from planner import plan, plan_json
from schemas.files import Flows, Topology
from topology import TopologyError
from topology.ecmp import HASH_MODELS, hash_model
from topology.model import Fabric

if TYPE_CHECKING:
    from c4.settings import Settings


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del settings  # offline: no broker, no Redis
    topology = load_document(args.topology, "topology", Topology)
    flows = load_document(args.flows, "flows", Flows)
    try:
        fabric = Fabric.from_topology(topology)
        model = hash_model(args.hash, args.seed) if args.hash else None
        result = plan(fabric, flows, hash_model=model)
    except TopologyError as error:
        print(f"c4: error: {error}", file=sys.stderr)
        return 1
    return write_output(args.out, plan_json(result) + b"\n")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``plan`` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="plan a path per flow (minimum max link utilisation)",
        description=(
            "Print the v1 plan of a flows file on a topology. With --hash, every path also "
            "carries 'sport': the UDP source port that makes that switch hash choose its spine."
        ),
    )
    parser.add_argument("--topology", required=True, help="v1 topology file")
    parser.add_argument("--flows", required=True, help="v1 flows file")
    parser.add_argument("--hash", choices=tuple(HASH_MODELS), help="switch hash model")
    parser.add_argument("--seed", type=int, default=0, help="hash seed (default 0)")
    parser.add_argument("--out", default="-", help="output file, or - for stdout (default)")
    parser.set_defaults(handler=_run)

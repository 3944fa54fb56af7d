"""Slurm's ``topology.conf`` (the ``topology/tree`` plugin) from a c4 topology.

With it, Slurm's own topology-aware placement keeps a job's nodes under few leaves, which
is what C4P's traffic planning assumes. A node is listed under the leaf of its first port:
on a multi-rail fabric every rail of a node sits in the same position of its plane, so the
first plane's grouping is the node's locality. Spines list the leaves they are linked to;
when there is more than one spine, a top switch joins them, because Slurm places a job
across switches only below a common ancestor.
"""

from __future__ import annotations

from collections import defaultdict

from schemas.files import Topology

TOP_SWITCH = "c4-top"


def render_topology_conf(topology: Topology) -> str:
    """The text of a ``topology.conf`` for the fabric, one switch per line."""
    tiers = {switch.id: switch.tier for switch in topology.switches}
    under_leaf: dict[str, list[str]] = defaultdict(list)
    for node in topology.nodes:
        if node.ports:
            under_leaf[node.ports[0].leaf].append(node.id)
    leaves_of_spine: dict[str, set[str]] = defaultdict(set)
    for link in topology.links:
        for spine, leaf in ((link.a, link.b), (link.b, link.a)):
            if tiers.get(spine) == 2 and leaf in under_leaf:
                leaves_of_spine[spine].add(leaf)
    lines = ["# Written by c4 from its topology file: Slurm's topology/tree plugin reads it."]
    lines += [f"SwitchName={leaf} Nodes={','.join(nodes)}" for leaf, nodes in under_leaf.items()]
    spines = [s.id for s in topology.switches if s.tier == 2 and s.id in leaves_of_spine]
    lines += [f"SwitchName={s} Switches={','.join(sorted(leaves_of_spine[s]))}" for s in spines]
    if len(spines) > 1:
        lines.append(f"SwitchName={TOP_SWITCH} Switches={','.join(spines)}")
    elif not spines and len(under_leaf) > 1:
        lines.append(f"SwitchName={TOP_SWITCH} Switches={','.join(under_leaf)}")
    return "\n".join(lines) + "\n"

"""The fabric from Slurm's ``topology.conf`` (the ``topology/tree`` plugin).

One switch a line: ``SwitchName=leaf01 Nodes=node-[000-031]`` for a leaf with its nodes,
``SwitchName=spine1 Switches=leaf[01-08]`` for a switch above others (keys are case-blind,
``#`` starts a comment, ``\\`` continues a line, ``LinkSpeed`` is ignored). The file names no
NIC ports: each node gets one port, `SLURM_PORT`, on the leaf that lists it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from topology.fabric import FabricFacts, NodePort, at_line
from topology.name_map import NO_RENAMES, NameMap

SLURM_PORT = "node:1"
_PAIR = re.compile(r"^([A-Za-z]+)=(\S+)$")
_KNOWN = {"switchname", "nodes", "switches", "linkspeed"}

Expand = Callable[[str], list[str]]


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each line, continuations joined and comments cut."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        start, before = pending if pending else (number, "")
        if line.endswith("\\"):
            pending = (start, before + line[:-1] + " ")
            continue
        pending = None
        if (before + line).strip():
            joined.append((start, (before + line).strip()))
    if pending and pending[1].strip():
        joined.append((pending[0], pending[1].strip()))
    return joined


def parse_slurm_topology(
    text: str,
    source: str,
    expand: Expand,
    names: NameMap = NO_RENAMES,
    port_gbps: float = 200.0,
    uplink_gbps: float = 400.0,
) -> FabricFacts:
    """The fabric of a topology.conf; ``expand`` expands a Slurm host list (``node-[0-3]``)
    and raises ValueError on a bad one. `ImportInputError` names the line of bad input."""
    facts = FabricFacts()
    defined: dict[str, int] = {}
    leaf_of: dict[str, str] = {}
    children: list[tuple[int, str, str]] = []
    for number, line in _logical_lines(text):
        fields: dict[str, str] = {}
        for word in line.split():
            pair = _PAIR.match(word)
            if pair is None or pair.group(1).lower() not in _KNOWN:
                raise at_line(source, number, f"not a topology.conf setting: {word[:80]!r}")
            fields[pair.group(1).lower()] = pair.group(2)
        if "switchname" not in fields:
            raise at_line(source, number, "no SwitchName=")
        switch = names.name(fields["switchname"])
        if switch in defined:
            detail = f"switch {switch!r} already defined on line {defined[switch]}"
            raise at_line(source, number, detail)
        defined[switch] = number
        facts.add_switch(switch)
        try:
            nodes = expand(fields["nodes"]) if "nodes" in fields else []
            below = expand(fields["switches"]) if "switches" in fields else []
        except ValueError as error:
            raise at_line(source, number, str(error)) from None
        for raw_node in nodes:
            node = names.name(raw_node)
            if node in leaf_of:
                detail = f"node {node!r} is under {leaf_of[node]!r} already"
                raise at_line(source, number, detail)
            leaf_of[node] = switch
            facts.add_port(NodePort(node, SLURM_PORT, switch, port_gbps))
        children += [(number, switch, names.name(child)) for child in below]
    for number, parent, child in children:
        if child not in defined:
            raise at_line(source, number, f"switch {child!r} is not defined")
        facts.add_cable(parent, child, uplink_gbps)
    return facts

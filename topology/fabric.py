"""The facts an import finds about a real fabric, and the v1 topology they make.

Every importer (ibnetdiscover, LLDP, Slurm's topology.conf) reduces its input to the same
facts: which switch each node port is cabled to, and which switches are cabled together.
Tiers are inferred, never read: a switch with node ports is a leaf, a switch cabled to a leaf
is a spine. The v1 topology has these two tiers only, so what a real fabric has besides is
left out and said: switches above the spines (a third tier, or the top switch a Slurm tree
joins its spines with) and cables between two leaves or two spines (MLAG peer links).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pydantic import ValidationError

from schemas.files import FabricLink, Switch, Topology, TopologyNode, TopologyPort
from topology import TopologyError

LINK_SEPARATOR = "~"  # a leaf-spine link's id, as `c4 topology gen` writes it


class ImportInputError(TopologyError):
    """Input an importer cannot read; the message is one line, with the line number."""


def at_line(source: str, line: int, detail: str) -> ImportInputError:
    """The error for line ``line`` (1-based) of ``source``."""
    return ImportInputError(f"{source}:{line}: {detail}")


@dataclass(frozen=True, slots=True)
class NodePort:
    """A node's port and the switch its cable goes to."""

    node: str
    port: str
    switch: str
    gbps: float


@dataclass(slots=True)
class FabricFacts:
    """What an importer found, in the order it found it (the output keeps that order)."""

    ports: list[NodePort] = field(default_factory=list)
    # Switch-to-switch cables: (a, b) -> the sum of their speeds (parallel cables add up).
    cables: dict[tuple[str, str], float] = field(default_factory=dict)
    switches: list[str] = field(default_factory=list)

    def add_switch(self, name: str) -> None:
        if name not in self.switches:
            self.switches.append(name)

    def add_port(self, port: NodePort) -> None:
        self.add_switch(port.switch)
        self.ports.append(port)

    def add_cable(self, a: str, b: str, gbps: float) -> None:
        self.add_switch(a)
        self.add_switch(b)
        key = (a, b) if a <= b else (b, a)
        self.cables[key] = self.cables.get(key, 0.0) + gbps


@dataclass(frozen=True, slots=True)
class Imported:
    """The topology, and one line per kind of thing of the input it leaves out."""

    topology: Topology
    notes: tuple[str, ...]


def _listed(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def build_topology(facts: FabricFacts, gpus: int) -> Imported:
    """The v1 topology of the facts; `ImportInputError` when they break one of its rules
    (the same port twice, a port on a switch that is not a leaf)."""
    for name in (*facts.switches, *(port.node for port in facts.ports)):
        if "/" in name:
            message = f"{name!r}: '/' joins node and port in ids: rename it with --map"
            raise ImportInputError(message)
    leaves = {port.switch for port in facts.ports}
    spines = {
        other
        for a, b in facts.cables
        for leaf, other in ((a, b), (b, a))
        if leaf in leaves and other not in leaves
    }
    above = [name for name in facts.switches if name not in leaves and name not in spines]
    same_tier = [
        f"{a}~{b}"
        for a, b in facts.cables
        if (a in leaves) == (b in leaves) and a not in above and b not in above
    ]
    notes = []
    if above:
        notes.append(f"left out {len(above)} switches with no leaf below: {_listed(above)}")
    if same_tier:
        notes.append(f"left out {len(same_tier)} cables within a tier: {_listed(same_tier)}")
    by_node: dict[str, list[TopologyPort]] = defaultdict(list)
    for port in facts.ports:
        by_node[port.node].append(TopologyPort(id=port.port, leaf=port.switch, gbps=port.gbps))
    nodes = [
        TopologyNode(id=node, gpus=gpus, ports=tuple(ports)) for node, ports in by_node.items()
    ]
    switches = [
        Switch(id=name, tier=1 if name in leaves else 2)
        for name in facts.switches
        if name in leaves or name in spines
    ]
    links = []
    for (a, b), gbps in facts.cables.items():
        if (a in leaves) == (b in leaves) or a in above or b in above:
            continue
        # A leaf first, as `topology gen` names them: leaf~spine.
        first, second = (b, a) if b in leaves and a not in leaves else (a, b)
        links.append(
            FabricLink(id=f"{first}{LINK_SEPARATOR}{second}", a=first, b=second, gbps=gbps)
        )
    try:
        topology = Topology(
            v=1, kind="topology", nodes=tuple(nodes), switches=tuple(switches), links=tuple(links)
        )
    except ValidationError as error:
        first_error = error.errors()[0]
        where = ".".join(str(part) for part in first_error["loc"])
        message = f"the fabric found is not a valid topology: {where}: {first_error['msg']}"
        raise ImportInputError(message) from None
    return Imported(topology, tuple(notes))

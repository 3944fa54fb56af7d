"""What changed between two topologies of one fabric: moved cables, missing ports, new switches.

Ports are compared by ``node/port``, switches by id, switch-to-switch cables by the pair of
switches they join (their ids may be written either way round).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.files import Topology


@dataclass(frozen=True, slots=True)
class Change:
    """One difference, as a line a person reads: ``what`` is the sort key and first word."""

    what: str
    subject: str
    detail: str

    def line(self) -> str:
        return f"{self.what} {self.subject}: {self.detail}"


def _ports(topology: Topology) -> dict[str, tuple[str, float]]:
    return {
        f"{node.id}/{port.id}": (port.leaf, port.gbps)
        for node in topology.nodes
        for port in node.ports
    }


def _cables(topology: Topology) -> dict[frozenset[str], float]:
    cables: dict[frozenset[str], float] = {}
    for link in topology.links:
        pair = frozenset((link.a, link.b))
        cables[pair] = cables.get(pair, 0.0) + link.gbps
    return cables


def _pair(pair: frozenset[str]) -> str:
    return "~".join(sorted(pair))


def topology_changes(old: Topology, new: Topology) -> list[Change]:
    """Every difference from ``old`` to ``new``, grouped by kind, each group sorted."""
    changes: list[Change] = []
    old_ports, new_ports = _ports(old), _ports(new)
    for port in sorted(old_ports.keys() & new_ports.keys()):
        (was, was_gbps), (now, now_gbps) = old_ports[port], new_ports[port]
        if was != now:
            changes.append(Change("moved", port, f"{was} -> {now}"))
        elif was_gbps != now_gbps:
            changes.append(Change("speed", port, f"{was_gbps:g} -> {now_gbps:g} Gb/s"))
    changes += [
        Change("missing", port, f"port was on {old_ports[port][0]}")
        for port in sorted(old_ports.keys() - new_ports.keys())
    ]
    changes += [
        Change("new", port, f"port on {new_ports[port][0]}")
        for port in sorted(new_ports.keys() - old_ports.keys())
    ]
    old_tiers = {switch.id: switch.tier for switch in old.switches}
    new_tiers = {switch.id: switch.tier for switch in new.switches}
    changes += [
        Change("missing", switch, f"switch (tier {old_tiers[switch]})")
        for switch in sorted(old_tiers.keys() - new_tiers.keys())
    ]
    changes += [
        Change("new", switch, f"switch (tier {new_tiers[switch]})")
        for switch in sorted(new_tiers.keys() - old_tiers.keys())
    ]
    changes += [
        Change("tier", switch, f"{old_tiers[switch]} -> {new_tiers[switch]}")
        for switch in sorted(old_tiers.keys() & new_tiers.keys())
        if old_tiers[switch] != new_tiers[switch]
    ]
    old_cables, new_cables = _cables(old), _cables(new)
    for pair in sorted(old_cables.keys() - new_cables.keys(), key=_pair):
        changes.append(Change("missing", _pair(pair), "switch cable"))
    for pair in sorted(new_cables.keys() - old_cables.keys(), key=_pair):
        changes.append(Change("new", _pair(pair), "switch cable"))
    for pair in sorted(old_cables.keys() & new_cables.keys(), key=_pair):
        if old_cables[pair] != new_cables[pair]:
            detail = f"{old_cables[pair]:g} -> {new_cables[pair]:g} Gb/s"
            changes.append(Change("speed", _pair(pair), detail))
    return changes

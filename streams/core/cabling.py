"""Miscabling: a port that LLDP finds on another leaf than the topology says.

The node agents report their ports' neighbours (``neighbours`` messages, ``c4 agent
--lldp``); each port the topology places is compared with them. A port on another switch is a
fabric-wide ``miscabled`` finding naming the port and both leaves. The topology is never
corrected from it: the finding stays until a report finds the port on its expected leaf
(mis-cabling is a known cause of rail imbalance, and the planner must not be told a fabric
that nobody checked). Ports the topology does not know are left alone.
"""

from __future__ import annotations

from typing import Final, Literal

from schemas.files import Topology
from schemas.messages import Diagnosis, Neighbours
from streams.core.findings import FindingBook, SuspectScore

CLASS: Final[Literal["miscabled"]] = "miscabled"
FOUND_LEAF_SCORE = 0.5  # the leaf is where the cable is, not what is broken


class CablingCheck:
    """The topology's leaf of every port, and the ports found elsewhere."""

    def __init__(self, topology: Topology | None) -> None:
        self._leaf_of: dict[str, str] = {
            f"{node.id}/{port.id}": port.leaf
            for node in (topology.nodes if topology is not None else ())
            for port in node.ports
        }
        self.book = FindingBook()
        self._found_on: dict[str, str] = {}  # port -> the wrong switch its finding names

    def on_neighbours(self, message: Neighbours) -> list[Diagnosis]:
        """Findings fired or resolved by one node's report."""
        out: list[Diagnosis] = []
        now = message.ts_ns
        for reported in message.ports:
            port = f"{message.node}/{reported.port}"
            expected = self._leaf_of.get(port)
            if expected is None:
                continue
            before = self._found_on.get(port)
            if before is not None and before != reported.switch:
                self._found_on.pop(port)
                resolved = self.book.resolve(None, CLASS, port, now)
                if resolved is not None:
                    out.append(resolved)
            if reported.switch == expected or before == reported.switch:
                continue
            evidence: dict[str, object] = {
                "port": port,
                "expected_leaf": expected,
                "found_leaf": reported.switch,
            }
            if reported.switch_port is not None:
                evidence["switch_port"] = reported.switch_port
            suspects = (
                SuspectScore("port", port, 1.0),
                SuspectScore("switch", reported.switch, FOUND_LEAF_SCORE),
            )
            self._found_on[port] = reported.switch
            self.book.fire_into(out, None, CLASS, port, now, now, suspects, evidence)
        return out

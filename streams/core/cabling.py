"""Miscabling: a port that LLDP finds on another leaf than the topology says.

The node agents report their ports' neighbours (``neighbours`` messages, ``c4 agent
--lldp``); each port the topology places is compared with them. A port on another switch is a
fabric-wide ``miscabled`` finding naming the port and both leaves. The topology is never
corrected from it: the finding stays until a report finds the port on its expected leaf
(mis-cabling is a known cause of rail imbalance, and the planner must not be told a fabric
that nobody checked). Ports the topology does not know are left alone.
"""

from __future__ import annotations

from typing import Any, Final, Literal

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

    # --- state, keyed by node (a node's reports reach the worker that owns the node) -----
    def nodes(self) -> set[str]:
        """The nodes with a port found on another leaf."""
        return {_node_of(port) for port in self._found_on}

    def node_state(self, node: str) -> dict[str, Any] | None:
        """One node's ports found elsewhere and their open findings; None when it has none."""
        found = {port: switch for port, switch in self._found_on.items() if _node_of(port) == node}
        if not found:
            return None
        return {"found_on": found, "findings": self.book.state(lambda key: key in found)}

    def restore_node(self, state: dict[str, Any]) -> None:
        """Take one node's state from a snapshot (its findings were published already)."""
        found = state["found_on"]
        self._found_on.update({str(port): str(switch) for port, switch in found.items()})
        self.book.restore(state["findings"])

    def drop_node(self, node: str) -> None:
        """Forget one node (another worker holds it now)."""
        for port in [port for port in self._found_on if _node_of(port) == node]:
            del self._found_on[port]
        self.book.drop(lambda key: _node_of(key) == node)


def _node_of(port: str) -> str:
    return port.split("/", 1)[0]

"""Models of the v1 files read and written by the offline commands: topology, flows, plan."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from schemas.base import MAX_ITEMS, C4Model, Id, NonNegFloat, NonNegInt, PositiveFloat, broken_rule


class TopologyPort(C4Model):
    """One NIC port of a node and the leaf switch its cable goes to."""

    id: Id
    leaf: Id
    gbps: PositiveFloat


class TopologyNode(C4Model):
    """A node: how many GPUs it has and its NIC ports."""

    id: Id
    gpus: NonNegInt
    ports: tuple[TopologyPort, ...] = Field(max_length=1024)


class Switch(C4Model):
    """A leaf (tier 1) or spine (tier 2) switch."""

    id: Id
    tier: Literal[1, 2]


class FabricLink(C4Model):
    """A switch-to-switch link; a port's own cable is named by the port and not listed."""

    id: Id
    a: Id
    b: Id
    gbps: PositiveFloat


class Topology(C4Model):
    """A 2-tier leaf-spine fabric: nodes with their ports, switches, links."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {
            "x-c4-rules": [
                "node, switch and link ids are unique; port ids are unique within a node",
                "a port's leaf is not a listed spine (an unlisted leaf is implied, tier 1)",
                "every link joins two different known switches",
            ]
        }
    }

    v: Literal[1]
    kind: Literal["topology"]
    nodes: tuple[TopologyNode, ...] = Field(max_length=MAX_ITEMS)
    switches: tuple[Switch, ...] = Field(max_length=MAX_ITEMS)
    links: tuple[FabricLink, ...] = Field(max_length=MAX_ITEMS * 4)

    @model_validator(mode="after")
    def _check_references(self) -> Self:
        tiers: dict[str, int] = {}
        for index, switch in enumerate(self.switches):
            if switch.id in tiers:
                broken_rule(f"switches[{index}].id", f"{switch.id!r} listed twice")
            tiers[switch.id] = switch.tier
        node_ids: set[str] = set()
        for index, node in enumerate(self.nodes):
            if node.id in node_ids:
                broken_rule(f"nodes[{index}].id", f"{node.id!r} listed twice")
            node_ids.add(node.id)
            port_ids: set[str] = set()
            for port_index, port in enumerate(node.ports):
                where = f"nodes[{index}].ports[{port_index}]"
                if port.id in port_ids:
                    broken_rule(f"{where}.id", f"{port.id!r} listed twice in {node.id}")
                port_ids.add(port.id)
                if tiers.get(port.leaf, 1) != 1:
                    broken_rule(f"{where}.leaf", f"{port.leaf!r} is a spine, not a leaf")
        link_ids: set[str] = set()
        for index, link in enumerate(self.links):
            if link.id in link_ids:
                broken_rule(f"links[{index}].id", f"{link.id!r} listed twice")
            link_ids.add(link.id)
            for end in ("a", "b"):
                name = getattr(link, end)
                if name not in tiers:
                    broken_rule(f"links[{index}].{end}", f"unknown switch {name!r}")
            if link.a == link.b:
                broken_rule(f"links[{index}].b", f"link joins {link.a!r} to itself")
        return self


class Flow(C4Model):
    """One flow from a NIC port to another (``node/port`` ids) with its demand."""

    id: Id
    src: Id = Field(pattern=r"^[^/]+/[^/]+$")
    dst: Id = Field(pattern=r"^[^/]+/[^/]+$")
    gbps: PositiveFloat
    # The phase of the iteration the flow runs in (an addition to v1): flows of different
    # phases never run at the same time and do not compete for a link. None: the unnamed
    # phase, so a file without phases is one phase, as before.
    phase: Id | None = None


class Flows(C4Model):
    """Planner input: the flows and the links that must not be used."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {"x-c4-rules": ["flow ids are unique", "src != dst"]}
    }

    v: Literal[1]
    kind: Literal["flows"]
    flows: tuple[Flow, ...] = Field(max_length=MAX_ITEMS * 4)
    down: tuple[Id, ...] = Field(default=(), max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _check_flows(self) -> Self:
        seen: set[str] = set()
        for index, flow in enumerate(self.flows):
            if flow.id in seen:
                broken_rule(f"flows[{index}].id", f"{flow.id!r} listed twice")
            seen.add(flow.id)
            if flow.src == flow.dst:
                broken_rule(f"flows[{index}].dst", f"same port as src {flow.src!r}")
        return self


class PlanPath(C4Model):
    """The path of one flow: the spine used (null within one leaf) and every link crossed."""

    flow: Id
    via: Id | None
    links: tuple[Id, ...] = Field(min_length=1, max_length=16)


class Plan(C4Model):
    """Planner output: a path per flow and the largest link utilisation."""

    v: Literal[1]
    kind: Literal["plan"]
    paths: tuple[PlanPath, ...] = Field(max_length=MAX_ITEMS * 4)
    max_util: NonNegFloat
    # Per named phase of the flows, its own max_util (an addition to v1; absent without phases).
    phases: dict[Id, NonNegFloat] | None = Field(default=None, max_length=MAX_ITEMS)

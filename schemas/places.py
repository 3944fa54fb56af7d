"""Where a suspect sits, read from its contract id: its node, GPU index, NIC device and port.

``node-001`` is a node; ``node-001/gpu3`` GPU 3 of node-001; ``node-001/mlx5_0:1`` port 1 of
NIC mlx5_0 of node-001, and, as a ``link``, that port's own cable. Fabric links
(``leaf-0a~spine-3``), switches and ranks sit on no node. The exporters' label names
(dcgm-exporter's ``Hostname``/``gpu``, node_exporter's ``device``/``port``) are the
callers' business.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Place:
    """A suspect's node, GPU index, NIC device and port number; None where it has none."""

    node: str | None = None
    gpu: str | None = None
    device: str | None = None
    port: str | None = None


def suspect_place(suspect_type: str, ident: str) -> Place:
    """Where a suspect of this type and id sits."""
    if suspect_type == "node":
        return Place(node=ident)
    node, slash, local = ident.partition("/")
    if not (slash and node and local):
        return Place()
    if suspect_type == "gpu":
        index = local.removeprefix("gpu")
        return Place(node=node, gpu=index if index.isdigit() else None)
    if suspect_type in ("port", "link"):
        device, _, number = local.partition(":")
        return Place(node=node, device=device, port=number or None)
    return Place()

"""Where a communicator's traffic goes: the one model the planner and the simulator share.

A communicator's members are in communicator-rank order, each on a node. Its traffic:

- members all on one node (tensor parallel, or any group inside a node): NVLink only, no
  network traffic;
- a pair (pipeline send/recv between neighbouring stages): its two directions;
- more members over several nodes (data or expert parallel): a ring that NCCL lays out to
  leave each node through the NIC ports of a rail-optimised fabric. The ring visits the
  members position-major: the first member of every node (nodes in order of their first
  member), then the second member of every node, and so on. Each member then sends on one
  connection and receives on one, and a hop between two nodes joins members at the same
  position on their nodes, GPU ``g`` to GPU ``g`` when members sit alike on every node: the
  same rail, as NCCL's per-rail channels have it. Hops between two members of one node are
  NVLink; they occur only where nodes hold different numbers of members.

A hop between two nodes goes from the sender's NIC port to the receiver's (per the topology
file), at the slower port's line rate; its flow id is ``<job>/<comm>/<src>-><dst>`` in
communicator ranks, the id the planner's flows, the simulator's connections and routes use.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def ring_order(nodes: Sequence[Hashable]) -> tuple[int, ...]:
    """The communicator ranks in ring order, given each member's node (see the module doc)."""
    by_node: dict[Hashable, list[int]] = {}
    for rank, node in enumerate(nodes):
        by_node.setdefault(node, []).append(rank)
    columns = list(by_node.values())
    deepest = max((len(column) for column in columns), default=0)
    return tuple(
        column[position]
        for position in range(deepest)
        for column in columns
        if position < len(column)
    )


def ring_hops(nodes: Sequence[Hashable]) -> tuple[tuple[int, int], ...]:
    """Every hop ``(src, dst)`` of the communicator's traffic, in communicator ranks.

    One hop per member (its send), in ring order; none for a single member; a pair's two
    directions. Inside one node every hop is NVLink (see `network_hops`).
    """
    order = ring_order(nodes)
    n = len(order)
    if n < 2:
        return ()
    return tuple((order[k], order[(k + 1) % n]) for k in range(n))


def network_hops(nodes: Sequence[Hashable]) -> tuple[tuple[int, int], ...]:
    """The hops of `ring_hops` between two nodes: the traffic on NIC ports."""
    return tuple((a, b) for a, b in ring_hops(nodes) if nodes[a] != nodes[b])


def flow_id(job: str, comm: str, src: int, dst: int) -> str:
    """The id of the flow of one hop."""
    return f"{job}/{comm}/{src}->{dst}"

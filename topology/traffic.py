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
file); its flow id is ``<job>/<comm>/<src>-><dst>`` in communicator ranks, the id the
planner's flows, the simulator's connections and routes use.

Phases. A training iteration runs its communicators' traffic in phases that do not overlap
on a port: the data-parallel reduce-scatter/all-gather (or all-reduce) per gradient bucket,
the pipeline's send/recv per micro-batch, the expert all-to-all per MoE layer. Each
communicator's kind (`comm_kinds`) is its flows' phase: flows of different phases never run
at the same time, so they do not compete for a link (the planner plans each phase apart).
Jobs are taken as aligned (every job's data-parallel phase at once, and so on): the worst
case for a phase, not a claim that phases of different jobs never meet.

- ``pp``: a pipeline pair, named ``<pipeline group>:p2p:<lo>-<hi>`` as the contract's
  collective messages name it: its two directions;
- ``world``: a communicator over every rank of a job that has other communicators over
  several nodes (the default process group: barriers and small collectives): a ring;
- ``ep``: a communicator inside another one over several nodes (an expert group inside its
  data-parallel group): an all-to-all, every ordered pair of members on different nodes (``n (n-1)``
  flows for ``n`` members on ``n`` nodes), each from the sender's port to the receiver's;
- ``dp``: any other communicator (data parallel; a plain job's one communicator): a ring.

Demand (`shared_gbps`): a port's flows in one phase share its line rate (a ring hop gets it
whole, an all-to-all pair ``1/(n-1)`` of it, a middle pipeline stage's sends to the next and
the previous stage half each), and a flow runs at the lower of its two ends' shares.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

Kind = Literal["dp", "pp", "ep", "world"]
KINDS: tuple[Kind, ...] = ("dp", "pp", "ep", "world")
P2P_MARK = ":p2p:"


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


def all_pairs(nodes: Sequence[Hashable]) -> tuple[tuple[int, int], ...]:
    """Every ordered pair ``(src, dst)`` of members on different nodes: an all-to-all."""
    return tuple(
        (a, b)
        for a, node_a in enumerate(nodes)
        for b, node_b in enumerate(nodes)
        if a != b and node_a != node_b
    )


def kind_hops(kind: Kind, nodes: Sequence[Hashable]) -> tuple[tuple[int, int], ...]:
    """The network hops of a communicator of this kind: all pairs for ``ep``, else the ring's."""
    return all_pairs(nodes) if kind == "ep" else network_hops(nodes)


def comm_kinds(
    comms: Mapping[str, Sequence[int]],
    ranks: int | None = None,
    node_of: Mapping[int, Hashable] | None = None,
) -> dict[str, Kind]:
    """Each communicator's kind (see the module doc), from ids and members.

    ``ranks`` is the job's world size (default: the ranks the communicators hold). With
    ``node_of`` (rank -> node; a rank missing is a node of its own) only communicators over
    several nodes count as others for ``world`` and as holders for ``ep`` (a plain job's one
    ring holds its tensor-parallel groups inside nodes: it stays ``dp``); without it every
    communicator counts. A communicator inside one node gets a kind too (it has no flows).
    """
    world = ranks if ranks is not None else len({r for members in comms.values() for r in members})
    kinds: dict[str, Kind] = {}
    collective: dict[str, frozenset[int]] = {}
    for comm, members in comms.items():
        if P2P_MARK in comm:
            kinds[comm] = "pp"
        else:
            collective[comm] = frozenset(members)

    def crossing(group: frozenset[int]) -> bool:
        if node_of is None:
            return True
        return len({node_of.get(rank, ("?", rank)) for rank in group}) > 1

    network = {comm: group for comm, group in collective.items() if crossing(group)}
    if len(network) > 1:
        for comm, group in network.items():
            if len(group) >= world > 1:
                kinds[comm] = "world"
    inner = {comm: group for comm, group in collective.items() if comm not in kinds}
    # A communicator is an expert group when a larger one holds it: look only at those that
    # hold its lowest member (each rank is in a few communicators).
    holding: dict[int, list[frozenset[int]]] = {}
    for comm, group in inner.items():
        if comm in network:
            for rank in group:
                holding.setdefault(rank, []).append(group)
    for comm, group in inner.items():
        held = bool(group) and any(
            len(other) > len(group) and group < other for other in holding.get(min(group), ())
        )
        kinds[comm] = "ep" if held else "dp"
    return kinds


def shared_gbps(
    ends: Sequence[tuple[Hashable, Hashable]],
    src_gbps: Sequence[float],
    dst_gbps: Sequence[float],
) -> list[float]:
    """Each flow's demand when the flows leaving (entering) one end share its line rate.

    ``ends[k]`` are flow ``k``'s sending and receiving ends (a port, or a port in one phase),
    ``src_gbps[k]`` / ``dst_gbps[k]`` their line rates; a flow gets the lower of its two
    shares.
    """
    sends: dict[Hashable, int] = {}
    receives: dict[Hashable, int] = {}
    for a, b in ends:
        sends[a] = sends.get(a, 0) + 1
        receives[b] = receives.get(b, 0) + 1
    return [
        min(src / sends[a], dst / receives[b])
        for (a, b), src, dst in zip(ends, src_gbps, dst_gbps, strict=True)
    ]

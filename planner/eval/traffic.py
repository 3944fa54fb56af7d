"""Workloads for the evaluation: concurrent jobs on random nodes, ring allreduce or permutation.

Jobs get random nodes, as a busy scheduler leaves them, so their traffic crosses leaves; a
job packed on one leaf has nothing to plan. Every flow asks for its port's line rate.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from schemas.files import Flows
from topology import TopologyError
from topology.model import Fabric

Pattern = Literal["ring", "permutation"]
PATTERNS: tuple[Pattern, ...] = ("ring", "permutation")


@dataclass(frozen=True, slots=True)
class Job:
    """A job's flows (indices into the workload's flows) and the bytes each carries per step.

    The job is synchronous: a step ends when its slowest flow has carried its bytes.
    """

    id: str
    flows: tuple[int, ...]
    flow_bytes: float
    # Queue pairs per ring hop: the hop's bytes split evenly over this many flows, each with
    # its own source port (so its own ECMP draw); the ring's rate is their sum.
    flows_per_hop: int = 1


@dataclass(frozen=True, slots=True)
class Workload:
    """The flows of all jobs, as the planner's v1 input, and the jobs."""

    flows: Flows
    jobs: tuple[Job, ...]


def workload(
    fabric: Fabric,
    pattern: Pattern,
    jobs: int,
    seed: int = 0,
    message_bytes: int = 1 << 30,
    qps: int = 1,
) -> Workload:
    """``jobs`` jobs on a random split of the nodes, each running ``pattern``.

    ring: one ring per local port (NCCL's channels, one per NIC port) over the job's nodes in
    rank order; an allreduce of ``message_bytes`` per node sends ``2 (n-1)/n`` of its share
    over every ring hop, as ``qps`` flows of an equal share (queue pairs; ids
    ``job/port/k`` for one, ``job/port/k/q`` for more). permutation: per plane, every port
    of the job sends to one other node's port and receives from one, ``message_bytes`` split
    over the ports.
    """
    if qps < 1:
        error = f"qps must be at least 1, got {qps}"
        raise TopologyError(error)
    nodes: dict[str, list[str]] = {}
    for port in fabric.ports.values():
        nodes.setdefault(port.node, []).append(port.id)
    names = list(nodes)
    if not 1 <= jobs <= len(names) // 2:
        error = f"{jobs} jobs do not fit {len(names)} nodes at two or more nodes each"
        raise TopologyError(error)
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    rng.shuffle(names)
    size = len(names) // jobs
    rows: list[dict[str, object]] = []
    result: list[Job] = []
    for j in range(jobs):
        members = names[j * size : (j + 1) * size]
        job = f"job-{j}"
        first = len(rows)
        per_hop = 1
        if pattern == "ring":
            flow_bytes = _ring(fabric, job, members, nodes, message_bytes, rows, qps)
            per_hop = qps
        else:
            flow_bytes = _permutation(fabric, job, members, nodes, message_bytes, rows, rng)
        result.append(Job(job, tuple(range(first, len(rows))), flow_bytes, per_hop))
    flows = Flows.model_validate({"v": 1, "kind": "flows", "flows": rows})
    return Workload(flows, tuple(result))


def _ring(
    fabric: Fabric,
    job: str,
    members: list[str],
    nodes: dict[str, list[str]],
    message_bytes: int,
    rows: list[dict[str, object]],
    qps: int,
) -> float:
    n = len(members)
    locals_ = [port.split("/", 1)[1] for port in nodes[members[0]]]
    for local in locals_:
        for k, node in enumerate(members):
            src, dst = f"{node}/{local}", f"{members[(k + 1) % n]}/{local}"
            gbps = fabric.ports[src].gbps / qps
            for q in range(qps):
                flow = f"{job}/{local}/{k}" if qps == 1 else f"{job}/{local}/{k}/{q}"
                rows.append({"id": flow, "src": src, "dst": dst, "gbps": gbps})
    return 2 * (n - 1) / n * message_bytes / len(locals_) / qps


def _permutation(
    fabric: Fabric,
    job: str,
    members: list[str],
    nodes: dict[str, list[str]],
    message_bytes: int,
    rows: list[dict[str, object]],
    rng: random.Random,
) -> float:
    by_plane: dict[int, list[str]] = {}
    for node in members:
        for port in nodes[node]:
            by_plane.setdefault(fabric.plane_of(port).index, []).append(port)
    for ports in by_plane.values():
        targets = _derangement(ports, rng, lambda port: fabric.ports[port].node)
        for src, dst in zip(ports, targets, strict=True):
            gbps = fabric.ports[src].gbps
            rows.append({"id": f"{job}/{src}", "src": src, "dst": dst, "gbps": gbps})
    return message_bytes / len(nodes[members[0]])


def _derangement(ports: list[str], rng: random.Random, node_of: Callable[[str], str]) -> list[str]:
    """A random permutation of ports where no port sends to its own node."""
    targets = list(ports)
    rng.shuffle(targets)
    # Swap each conflict with a random partner whose swap resolves both ends; with at least
    # two nodes this ends quickly.
    for _ in range(100):
        clashes = [i for i in range(len(ports)) if node_of(ports[i]) == node_of(targets[i])]
        if not clashes:
            return targets
        for i in clashes:
            j = rng.randrange(len(ports))
            a, b = node_of(ports[i]), node_of(ports[j])
            if a != node_of(targets[j]) and b != node_of(targets[i]):
                targets[i], targets[j] = targets[j], targets[i]
    error = "no permutation without same-node pairs found"
    raise TopologyError(error)

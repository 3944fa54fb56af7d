"""The communicators of a job: who is in which group, in communicator-rank order.

A plain job has one data-parallel communicator over all ranks and, optionally, one
tensor-parallel group per node. A 3D-parallel job (`Parallel`) follows Megatron's rank order
(tp fastest, then dp, then pp): tensor-parallel groups inside a node, one data-parallel group
per (stage, tp index), expert-parallel groups of ``ep`` consecutive replicas inside it, and a
point-to-point communicator for each pair of neighbouring stages of one pipeline (the last
and the first stage too, interleaved), named after its pipeline group as the contract says
(``<group>:p2p:<lo>-<hi>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.scenario import JobSpec, Parallel

GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class Group:
    """One communicator of a job before placement: its name, kind and members."""

    name: str
    kind: str  # "dp", "tp", "ep" or "pp" (a point-to-point pair)
    members: tuple[int, ...]
    parent: str | None = None  # a pair's pipeline group (its id is the parent's + ":p2p:...")


@dataclass(frozen=True, slots=True)
class Coords:
    """Where a global rank sits in a 3D-parallel job."""

    tp: int
    dp: int
    pp: int


def data_parallel_size(spec: JobSpec, shape: Parallel) -> int:
    """Replicas of the model: ranks / (tp x pp)."""
    return spec.ranks // (shape.tp * shape.pp)


def coords(shape: Parallel, dp: int, rank: int) -> Coords:
    """The (tp, dp, pp) indices of a global rank."""
    return Coords(rank % shape.tp, (rank // shape.tp) % dp, rank // (shape.tp * dp))


def rank_at(shape: Parallel, dp: int, tp_index: int, dp_index: int, stage: int) -> int:
    """The global rank at (tp, dp, pp) indices."""
    return tp_index + shape.tp * (dp_index + dp * stage)


def groups(spec: JobSpec) -> list[Group]:
    """Every communicator of the job."""
    shape = spec.parallel
    if shape is None:
        found = [Group("dp", "dp", tuple(range(spec.ranks)))]
        if "tp" in spec.comms:
            for node in range(spec.ranks // GPUS_PER_NODE):
                members = tuple(range(node * GPUS_PER_NODE, (node + 1) * GPUS_PER_NODE))
                found.append(Group(f"tp{node}", "tp", members))
        return found
    dp = data_parallel_size(spec, shape)
    found = []
    for stage in range(shape.pp):
        for d in range(dp):
            if shape.tp > 1:
                members = tuple(rank_at(shape, dp, t, d, stage) for t in range(shape.tp))
                found.append(Group(f"tp{stage}.{d}", "tp", members))
        for t in range(shape.tp):
            if dp > 1:
                members = tuple(rank_at(shape, dp, t, d, stage) for d in range(dp))
                found.append(Group(f"dp{stage}.{t}", "dp", members))
            if shape.ep > 1:
                for block in range(dp // shape.ep):
                    members = tuple(
                        rank_at(shape, dp, t, block * shape.ep + e, stage) for e in range(shape.ep)
                    )
                    found.append(Group(f"ep{stage}.{t}.{block}", "ep", members))
    # Interleaved (virtual stages), the last stage's chunk feeds the first stage's next
    # chunk: a wrap-around pair, unless two stages share their one pair already.
    wrap = shape.virtual_stages > 1 and shape.pp > 2
    for d in range(dp):
        for t in range(shape.tp):
            for stage in range(shape.pp - 1 + wrap):
                a = rank_at(shape, dp, t, d, stage)
                b = rank_at(shape, dp, t, d, (stage + 1) % shape.pp)
                a, b = min(a, b), max(a, b)
                found.append(Group(f"pp{d}.{t}:p2p:{a}-{b}", "pp", (a, b), f"pp{d}.{t}"))
    return found

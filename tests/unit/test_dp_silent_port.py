"""A silent degraded port in a data-parallel ring (issue 36): named as the port, never as the
leaf it is cabled to; one port on every slow path names no fabric link or switch."""

from __future__ import annotations

import random

from schemas.files import FabricLink, Switch, Topology, TopologyNode, TopologyPort
from schemas.messages import Collective, Conns, Diagnosis, Job, Ops, RankPlace
from streams.core.engine import Engine
from streams.core.fabric import TIE_PATIENCE, FabricCorrelator
from streams.core.slowpath import SlowPath

S = 1_000_000_000
MS = 1_000_000
T0 = 1_790_000_000 * S
GPUS = 8
NODES = 4
RANKS = GPUS * NODES
SPINES = 4
BYTES = 64 * 1024 * 1024


def rail_topology() -> Topology:
    """Rail-optimised: GPU g's port of every node on leaf-g; every leaf up to every spine."""
    nodes = tuple(
        TopologyNode(
            id=f"node-{n:03d}",
            gpus=GPUS,
            ports=tuple(
                TopologyPort(id=f"mlx5_{g}:1", leaf=f"leaf-{g}", gbps=200.0) for g in range(GPUS)
            ),
        )
        for n in range(NODES)
    )
    leaves = [f"leaf-{g}" for g in range(GPUS)]
    spines = [f"spine-{s}" for s in range(SPINES)]
    return Topology(
        v=1,
        kind="topology",
        nodes=nodes,
        switches=(
            *(Switch(id=leaf, tier=1) for leaf in leaves),
            *(Switch(id=spine, tier=2) for spine in spines),
        ),
        links=tuple(
            FabricLink(id=f"{leaf}~{spine}", a=leaf, b=spine, gbps=400.0)
            for leaf in leaves
            for spine in spines
        ),
    )


def place(rank: int) -> tuple[str, int, str]:
    return f"node-{rank // GPUS:03d}", rank % GPUS, f"mlx5_{rank % GPUS}:1"


def dp_job(degraded_rank: int | None, seconds: int = 80, onset_s: int = 30) -> list[object]:
    """One ring over every rank plus one tensor-parallel group per node (no connections:
    NVLink). The degraded port sends and receives at a third of its rate from ``onset_s``,
    without error counters: the ring is paced by that hop (every rank's operations take
    longer alike) and only the two connections through the port move more slowly."""
    rng = random.Random(7)  # noqa: S311 - test data
    world = "job-1-world"
    comms = {world: tuple(range(RANKS))}
    comms.update({f"job-1-tp{n}": tuple(range(n * GPUS, (n + 1) * GPUS)) for n in range(NODES)})
    job = Job(
        v=1,
        kind="job",
        job="job-1",
        ts_ns=T0,
        state="running",
        ranks=tuple(
            RankPlace(rank=r, node=place(r)[0], gpu=place(r)[1], port=place(r)[2])
            for r in range(RANKS)
        ),
        comms=comms,
    )
    out: list[object] = [job]
    seq = 0
    for second in range(1, seconds + 1):
        tick = T0 + second * S
        seqs = list(range(seq + 1, seq + 11))
        seq += 10
        starts = [tick - S + i * 100 * MS for i in range(10)]
        slow = degraded_rank is not None and second >= onset_s
        transfer = (90 if slow else 60) * MS
        for r in range(RANKS):
            node, gpu, port = place(r)
            enter = [s + int(rng.uniform(0, 3) * MS) for s in starts]
            ends = [s + transfer + int(rng.uniform(0, 2) * MS) for s in starts]
            ops = Ops(
                seq=tuple(seqs),
                op=tuple("allreduce" for _ in seqs),
                bytes=tuple(BYTES for _ in seqs),
                enter_ns=tuple(enter),
                end_ns=tuple(ends),
            )
            sent = 10 * BYTES
            touches = slow and degraded_rank in (r, (r + 1) % RANKS)
            busy = int(sent * 8 / 200e9 * S * (3.0 if touches else 1.0) * rng.uniform(0.95, 1.08))
            conns = Conns(peer=((r + 1) % RANKS,), port=(port,), bytes=(sent,), busy_ns=(busy,))
            for comm, size, rank, with_conns in (
                (world, RANKS, r, True),
                (f"job-1-tp{r // GPUS}", GPUS, r % GPUS, False),
            ):
                out.append(
                    Collective(
                        v=1,
                        kind="collective",
                        job="job-1",
                        comm=comm,
                        comm_size=size,
                        rank=rank,
                        global_rank=r,
                        node=node,
                        gpu=gpu,
                        ts_ns=tick,
                        ops=ops,
                        conns=conns if with_conns else None,
                    )
                )
    return out


def diagnose(messages: list[object]) -> list[Diagnosis]:
    engine = Engine(topology=rail_topology())
    found: list[Diagnosis] = []
    for message in messages:
        found.extend(engine.process(message))  # type: ignore[arg-type]
    found.extend(engine.check(engine.now_ns))
    return [d for d in found if d.state == "firing"]


def test_a_silent_degraded_port_of_a_ring_is_named_as_the_port() -> None:
    # Rank 11 (node-001, GPU 3): its own connection (11 -> 12) and the one it receives
    # (10 -> 11) slow; every other connection as fast as it was.
    found = diagnose(dp_job(degraded_rank=11))
    assert [(d.class_, d.suspects[0].id) for d in found] == [("comm_slow", "node-001/mlx5_3:1")]


def test_the_same_ring_healthy_names_nothing() -> None:
    assert diagnose(dp_job(degraded_rank=None)) == []


def _path(flow: str, src: str, dst: str) -> SlowPath:
    return SlowPath("job-1", f"job-1/world/{flow}", src, dst, None, None)


def test_slow_paths_that_share_one_port_name_no_link_or_switch() -> None:
    # What the port sends and what it receives, both across leaves, both slow: every uplink
    # of its leaf gets two votes, but one port explains both.
    correlator = FabricCorrelator(rail_topology())
    paths = [
        _path("10->11", "node-001/mlx5_2:1", "node-002/mlx5_3:1"),
        _path("11->12", "node-002/mlx5_3:1", "node-003/mlx5_4:1"),
    ]
    found = [correlator.check(T0 + i * S, paths) for i in range(TIE_PATIENCE + 10)]
    assert [d for batch in found for d in batch] == []


def test_slow_paths_from_distinct_ports_through_one_leaf_still_name_it() -> None:
    # The same count of paths, from two distinct ports of one leaf: the leaf explains them.
    correlator = FabricCorrelator(rail_topology())
    paths = [
        _path("10->11", "node-000/mlx5_3:1", "node-002/mlx5_4:1"),
        _path("26->27", "node-001/mlx5_3:1", "node-003/mlx5_5:1"),
    ]
    found = [d for i in range(TIE_PATIENCE + 10) for d in correlator.check(T0 + i * S, paths)]
    assert [(d.class_, d.suspects[0].id) for d in found] == [("link_degraded", "leaf-3")]

"""Iteration time in the simulator: jobs on ECMP, ECMP with 4 and 8 queue pairs, sprayed, C4P.

The C4 paper's comparison, on c4's own simulator (`simulator/`): concurrent training jobs on
random nodes of one 1:1 leaf-spine fabric (8 nodes a leaf, 8 dual-port 200G NICs a node,
spines at 400G), their traffic as `topology.traffic` lays it out (rings rail by rail, NVLink
inside a node). Each layout is simulated from the same seed under each method:
- ECMP: every connection on the spine the source leaf's hash picks (one source port per
  connection, as the RDMA stack draws it);
- ECMP 4QP / 8QP (Meta's queue-pair scaling): each connection as 4 or 8 queue pairs, each
  hashed on its own source port and asking for its share of the line rate; the connection
  runs at the queue-pair count times its slowest queue pair's rate;
- spray (a stand-in for flowlets and adaptive routing, per-packet-group spraying over the
  equal-cost paths): every connection split evenly over every spine, so a leaf's uplinks act
  as one link of their summed capacity;
- C4P: the spines of the plan `planner.plan` makes for the flows `reroute.job_flows` derives
  from the jobs' placements, each phase (data-parallel rings, pipeline pairs, expert
  all-to-alls) planned apart, as the product does.
Connections of one kind (those that carry traffic at the same time) that share a directed
link share it equally (the simulator's collision model), and a collective waits for its
slowest connection. Iteration time: the median interval between a data-parallel group's last
allreduce of successive iterations.

Three mixes (plain data-parallel jobs; 3D jobs: tp 8, pp 4, the rest data parallel; MoE:
tp 8, pp 2, data parallel 8 split into expert groups of 4) and two compute loads:
communication-bound (compute 0.1x the data-parallel step's ideal time) and moderate (1x).
An expert group's all-to-all runs as all pairs (12 connections per group of 4, each at a
third of its port's line rate), in the simulator as in the planner (`topology.traffic`);
MoE has pp 2 so that an expert group (4 replicas) sits inside a larger data-parallel group
(8), as c4 tells an expert group from the communicators alone. Prints, per case, the median
over placements of the iteration time under each method, C4P's plan ``max_util`` and bound
(per phase), and C4P's gain over ECMP and over ECMP 8QP.

    .venv/bin/python bench/bench_c4p_sim.py [--nodes 64] [--seeds 5] [--quick]
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import lower_bound, plan  # noqa: E402
from planner.reroute import job_flows  # noqa: E402
from schemas.files import Flows, Topology  # noqa: E402
from simulator.cluster import GPUS_PER_NODE, Cluster, Conn, build_cluster  # noqa: E402
from simulator.effects import job_effects  # noqa: E402
from simulator.jobsim import RDMA_STEP_NS, OpRun, simulate_job  # noqa: E402
from simulator.pipeline import simulate_parallel_job  # noqa: E402
from simulator.run import job_message  # noqa: E402
from simulator.scenario import MIB, Scenario, scenario_from  # noqa: E402
from topology.ecmp import SPORT_MAX, SPORT_MIN, Crc32Hash, Ecmp  # noqa: E402
from topology.generate import Shape, generate  # noqa: E402
from topology.model import Fabric  # noqa: E402
from topology.traffic import shared_gbps  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "c4p-sim.txt"
PORT_GBPS = 200.0
JOBS = 4
OP_BYTES = 256 * MIB  # a plain job's gradient allreduce per iteration
LOADS = {"comm-bound": 0.1, "moderate": 1.0}  # compute as a share of the ideal allreduce
# moe: pp 2, expert groups of 4 replicas (inside the 8 of a job on 64 nodes), one rank's input
EXPERT_PARALLEL, A2A_BYTES, MOE_STAGES = 4, 8 * MIB, 2
T0 = 1_700_000_000_000_000_000


METHODS = ("ecmp", "ecmp-4qp", "ecmp-8qp", "spray", "c4p")
HEADS = {"ecmp": "ECMP", "ecmp-4qp": "4QP", "ecmp-8qp": "8QP", "spray": "spray", "c4p": "C4P"}
MIXES = ("dp", "3d", "moe")


@dataclass(frozen=True, slots=True)
class Case:
    mix: str
    load: str
    ms: dict[str, float]  # per method, the median iteration time
    max_util: float
    bound: float


def fabric_topology(nodes: int) -> Topology:
    """The 1:1 fabric: 8 nodes a leaf, 64 ports of 200G down, 32 spines at 400G up."""
    shape = Shape(nodes=nodes, spines=32, nics=8, nodes_per_leaf=8, uplink_gbps=400.0)
    return generate(shape)


def ideal_allreduce_ms(ranks: int, nbytes: int) -> float:
    """A ring allreduce at line rate: 2(n-1)/n of the buffer over every hop, plus the steps."""
    wire = 2 * (ranks - 1) * nbytes * 8 / ranks / PORT_GBPS  # Gbit/s is bits per ns
    return (wire + 2 * (ranks - 1) * RDMA_STEP_NS) / 1e6


def scenario(topology: Topology, mix: str, load: float, seed: int, seconds: float) -> Scenario:
    """``JOBS`` jobs of one mix on a random split of the nodes."""
    names = [node.id for node in topology.nodes]
    random.Random(seed).shuffle(names)  # noqa: S311 -- a reproducible placement
    per_job = len(names) // JOBS
    jobs: list[dict[str, Any]] = []
    for j in range(JOBS):
        nodes = names[j * per_job : (j + 1) * per_job]
        ranks = per_job * GPUS_PER_NODE
        job: dict[str, Any] = {"id": f"job-{j}", "ranks": ranks, "nodes": nodes, "jitter": 0.005}
        if mix == "dp":
            compute = load * ideal_allreduce_ms(ranks, OP_BYTES)
            job |= {"op_bytes": OP_BYTES, "compute_ms": round(max(compute, 0.1), 3)}
        else:
            stages = MOE_STAGES if mix == "moe" else 4
            dp = ranks // (8 * stages)
            bucket = OP_BYTES // 4
            compute = load * 4 * ideal_allreduce_ms(dp, bucket) / 8 / 3  # fwd+bwd of 8 mb
            job["parallel"] = {
                "tp": 8,
                "pp": stages,
                "microbatches": 8,
                "forward_ms": round(max(compute, 0.05), 3),
                "bucket_bytes": bucket,
                "dp_buckets": 4,
                "activation_bytes": 32 * MIB,
                "gpu_spread": 0.0,
            }
            if mix == "moe":
                job["parallel"] |= {"ep": EXPERT_PARALLEL, "a2a_bytes": A2A_BYTES}
        jobs.append(job)
    return scenario_from(
        {
            "name": f"c4p-sim-{mix}",
            "seed": seed,
            "duration_s": seconds,
            "fabric": {"nodes_per_leaf": 8, "spines": 32},
            "jobs": jobs,
        }
    )


def planned_spines(topology: Topology, cluster: Cluster) -> tuple[dict[str, str], float, float]:
    """C4P's spine per flow for the cluster's jobs, the plan's max_util and its lower bound.

    Planned as `reroute` plans running jobs: each phase (communicator kind) apart.
    """
    fabric = Fabric.from_topology(topology)
    flows = job_flows(fabric, [job_message(job, T0) for job in cluster.jobs]).flows
    wanted = Flows(v=1, kind="flows", flows=flows)
    result = plan(fabric, wanted)
    spines = {path.flow: path.via for path in result.paths if path.via is not None}
    return spines, result.max_util, lower_bound(fabric, wanted)


def iteration_ms(cluster: Cluster, scn: Scenario) -> float:
    """The median over jobs of the median interval between a dp group's iteration ends."""
    per_job = []
    for job in cluster.jobs:
        simulate = simulate_parallel_job if job.spec.parallel is not None else simulate_job
        run = simulate(job, job_effects(cluster, scn, job), scn)
        every = job.spec.parallel.dp_buckets if job.spec.parallel is not None else 1
        dp = next(comm for comm in job.comms if comm.kind == "dp" and comm.ring is not None)
        ends = [_done(op) for op in run.runs[dp.id] if op.end is not None]
        last = ends[every - 1 :: every]
        gaps = [b - a for a, b in zip(last, last[1:], strict=False)]
        per_job.append(statistics.median(gaps) / 1e6)
    return statistics.median(per_job)


def _done(op: OpRun) -> int:
    assert op.end is not None  # noqa: S101 -- filtered by the caller
    return max(op.end)


def with_rates(cluster: Cluster, rates: Mapping[str, float]) -> Cluster:
    """The cluster with these connections' nominal rates (flow id -> Gbps)."""
    jobs = []
    for job in cluster.jobs:
        comms = []
        for comm in job.comms:
            if comm.ring is None:
                comms.append(comm)
                continue
            prefix = f"{job.spec.id}/{comm.id}/"
            ring, pairs = (
                None
                if conns is None
                else tuple(
                    replace(conn, gbps=rates.get(f"{prefix}{conn.src}->{conn.dst}", conn.gbps))
                    for conn in conns
                )
                for conns in (comm.ring, comm.pairs)
            )
            comms.append(replace(comm, ring=ring, pairs=pairs))
        jobs.append(replace(job, comms=tuple(comms)))
    return replace(cluster, jobs=tuple(jobs))


def multipath_rates(fabric: Fabric, cluster: Cluster, qps: int | None) -> dict[str, float]:
    """Each crossing connection's rate split over ``qps`` hashed queue pairs (None: sprayed
    over every spine), connections of one kind sharing each directed link equally; an
    all-to-all's connections are its pairs, each asking for its share of its ports."""
    ecmp = Ecmp(fabric, Crc32Hash())
    conns: list[tuple[str, str, int, int, float]] = []
    for job in cluster.jobs:
        for comm in job.comms:
            shares = _port_shares(fabric, comm.traffic()) if comm.pairs is not None else {}
            for conn in comm.traffic():
                a = fabric.index_of(str(conn.src_port))
                b = fabric.index_of(str(conn.dst_port))
                if fabric.port_leaf[a] == fabric.port_leaf[b]:
                    continue
                line = shares.get((conn.src, conn.dst)) or min(
                    fabric.link_gbps[a], fabric.link_gbps[b]
                )
                flow = f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}"
                conns.append((flow, comm.kind, a, b, line))
    if qps is None:
        return _sprayed(fabric, conns)
    spread = SPORT_MAX - SPORT_MIN + 1
    drawn: dict[str, list[tuple[int, int]]] = {}
    users: Counter[tuple[str, int]] = Counter()
    for flow, kind, a, b, _ in conns:
        links = []
        for q in range(qps):
            sport = SPORT_MIN + zlib.crc32(f"{flow}/q{q}".encode()) % spread
            spine = ecmp.choose(a, b, sport)
            up = 2 * fabric.uplinks[fabric.port_leaf[a]][spine]
            down = 2 * fabric.uplinks[fabric.port_leaf[b]][spine] + 1
            links += [(up, down)]
            users.update(((kind, up), (kind, down)))
        drawn[flow] = links
    rates = {}
    for flow, kind, _, _, line in conns:
        slowest = min(
            min(line / qps, *(fabric.directed_gbps[x] / users[(kind, x)] for x in pair))
            for pair in drawn[flow]
        )
        rates[flow] = qps * slowest
    return rates


def _port_shares(fabric: Fabric, conns: tuple[Conn, ...]) -> dict[tuple[int, int], float]:
    """An all-to-all pair's share of its ports' line rate (`traffic.shared_gbps`)."""
    rates = shared_gbps(
        [(conn.src_port, conn.dst_port) for conn in conns],
        [fabric.link_gbps[fabric.index_of(str(conn.src_port))] for conn in conns],
        [fabric.link_gbps[fabric.index_of(str(conn.dst_port))] for conn in conns],
    )
    return {(conn.src, conn.dst): rate for conn, rate in zip(conns, rates, strict=True)}


def _sprayed(fabric: Fabric, conns: list[tuple[str, str, int, int, float]]) -> dict[str, float]:
    """Sprayed connections: a leaf's uplinks (downlinks) as one link of their summed speed."""
    capacity = [0.0] * (2 * len(fabric.uplinks))
    for leaf, ups in enumerate(fabric.uplinks):
        for link in ups.values():
            capacity[2 * leaf] += fabric.directed_gbps[2 * link]
            capacity[2 * leaf + 1] += fabric.directed_gbps[2 * link + 1]
    users: Counter[tuple[str, int]] = Counter()
    for _, kind, a, b, _ in conns:
        users.update(((kind, 2 * fabric.port_leaf[a]), (kind, 2 * fabric.port_leaf[b] + 1)))
    rates = {}
    for flow, kind, a, b, line in conns:
        ends = (2 * fabric.port_leaf[a], 2 * fabric.port_leaf[b] + 1)
        rates[flow] = min(line, *(capacity[x] / users[(kind, x)] for x in ends))
    return rates


def run_case(nodes: int, mix: str, load: str, seeds: int, seconds: float) -> Case:
    topology = fabric_topology(nodes)
    fabric = Fabric.from_topology(topology)
    times: dict[str, list[float]] = {method: [] for method in METHODS}
    utils, bounds = [], []
    for seed in range(seeds):
        scn = scenario(topology, mix, LOADS[load], seed, seconds)
        on_ecmp = build_cluster(topology, scn)
        spines, max_util, bound = planned_spines(topology, on_ecmp)
        clusters = {
            "ecmp": on_ecmp,
            "ecmp-4qp": with_rates(on_ecmp, multipath_rates(fabric, on_ecmp, 4)),
            "ecmp-8qp": with_rates(on_ecmp, multipath_rates(fabric, on_ecmp, 8)),
            "spray": with_rates(on_ecmp, multipath_rates(fabric, on_ecmp, None)),
            "c4p": build_cluster(topology, scn, spines),
        }
        for method, cluster in clusters.items():
            times[method].append(iteration_ms(cluster, scn))
        utils.append(max_util)
        bounds.append(bound)
    return Case(
        mix,
        load,
        {method: statistics.median(ms) for method, ms in times.items()},
        statistics.median(utils),
        statistics.median(bounds),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="event time simulated")
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 s simulated, no file")
    parser.add_argument("--mixes", default="", help="comma-separated mixes (default: all)")
    args = parser.parse_args()
    nodes, seeds = args.nodes, (1 if args.quick else args.seeds)
    seconds = 3.0 if args.quick else args.seconds
    started = time.perf_counter()
    lines = [
        f"C4P against ECMP, queue-pair scaling and spraying in the simulator: {JOBS} jobs on "
        f"{nodes} nodes ({nodes * GPUS_PER_NODE} GPUs), 1:1 fabric, medians over {seeds} "
        "placements",
        f"{'mix':<4}{'load':>12}"
        + "".join(f"{HEADS[m] + ' ms':>10}" for m in METHODS)
        + f"{'vs ECMP':>9}{'vs 8QP':>8}{'plan max util':>15}{'bound':>7}",
    ]
    mixes = MIXES if not args.mixes else tuple(args.mixes.split(","))
    for mix in mixes:
        for load in LOADS:
            case = run_case(nodes, mix, load, seeds, seconds)
            c4p = case.ms["c4p"]
            lines.append(
                f"{mix:<4}{load:>12}"
                + "".join(f"{case.ms[m]:>10.1f}" for m in METHODS)
                + f"{case.ms['ecmp'] / c4p - 1:>+9.0%}{case.ms['ecmp-8qp'] / c4p - 1:>+8.0%}"
                f"{case.max_util:>15.2f}{case.bound:>7.2f}"
            )
            print(lines[-1], file=sys.stderr)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines.append(
        "iteration time: median interval between a data-parallel group's iteration ends; "
        "vs ECMP, vs 8QP: that method's time over C4P's;\nplan max util: the largest of the "
        "phases' (each phase planned apart, as reroute plans running jobs); bound: per phase"
    )
    lines.append(f"wall time {time.perf_counter() - started:.0f} s, peak RSS {peak:.0f} MiB")
    text = "\n".join(lines)
    print(text)
    if not args.quick and not args.mixes:
        RESULTS.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Iteration time in the simulator: jobs on ECMP's routes against the same jobs on C4P's plan.

The C4 paper's comparison, on c4's own simulator (`simulator/`): concurrent training jobs on
random nodes of one 1:1 leaf-spine fabric (8 nodes a leaf, 8 dual-port 200G NICs a node,
spines at 400G), their traffic as `topology.traffic` lays it out (rings rail by rail, NVLink
inside a node). Each layout is simulated twice from the same seed: once with every
connection on the spine the source leaf's ECMP hash picks (one source port per connection,
as the RDMA stack draws it), once on the spines of the plan `planner.plan` makes for
the flows `reroute.job_flows` derives from the jobs' placements. A connection that shares a
directed link with others of its kind gets its share (the simulator's collision model), and
a collective waits for its slowest connection. Iteration time: the median interval between a
data-parallel group's last allreduce of successive iterations.

Two mixes (plain data-parallel jobs; 3D jobs: tp 8, pp 4, the rest data parallel) and two
compute loads: communication-bound (compute 0.1x the allreduce's ideal time) and moderate
(1x). Prints, per case, the median over placements of the iteration time under each, the
plan's ``max_util`` and bound, and C4P's gain; medians over ``--seeds`` placements.

    .venv/bin/python bench/bench_c4p_sim.py [--nodes 64] [--seeds 5] [--quick]
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import lower_bound, plan  # noqa: E402
from planner.reroute import job_flows  # noqa: E402
from schemas.files import Flows, Topology  # noqa: E402
from simulator.cluster import GPUS_PER_NODE, Cluster, build_cluster  # noqa: E402
from simulator.effects import job_effects  # noqa: E402
from simulator.jobsim import RDMA_STEP_NS, OpRun, simulate_job  # noqa: E402
from simulator.pipeline import simulate_parallel_job  # noqa: E402
from simulator.run import job_message  # noqa: E402
from simulator.scenario import MIB, Scenario, scenario_from  # noqa: E402
from topology.generate import Shape, generate  # noqa: E402
from topology.model import Fabric  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "c4p-sim.txt"
PORT_GBPS = 200.0
JOBS = 4
OP_BYTES = 256 * MIB  # a plain job's gradient allreduce per iteration
LOADS = {"comm-bound": 0.1, "moderate": 1.0}  # compute as a share of the ideal allreduce
T0 = 1_700_000_000_000_000_000


@dataclass(frozen=True, slots=True)
class Case:
    mix: str
    load: str
    ecmp_ms: float
    plan_ms: float
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
            dp = ranks // (8 * 4)
            bucket = OP_BYTES // 4
            compute = load * 4 * ideal_allreduce_ms(dp, bucket) / 8 / 3  # fwd+bwd of 8 mb
            job["parallel"] = {
                "tp": 8,
                "pp": 4,
                "microbatches": 8,
                "forward_ms": round(max(compute, 0.05), 3),
                "bucket_bytes": bucket,
                "dp_buckets": 4,
                "activation_bytes": 32 * MIB,
                "gpu_spread": 0.0,
            }
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

    Planned as `reroute` plans running jobs: every communicator's flows at once.
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


def run_case(nodes: int, mix: str, load: str, seeds: int, seconds: float) -> Case:
    topology = fabric_topology(nodes)
    ecmp_ms, plan_ms, utils, bounds = [], [], [], []
    for seed in range(seeds):
        scn = scenario(topology, mix, LOADS[load], seed, seconds)
        on_ecmp = build_cluster(topology, scn)
        spines, max_util, bound = planned_spines(topology, on_ecmp)
        on_plan = build_cluster(topology, scn, spines)
        ecmp_ms.append(iteration_ms(on_ecmp, scn))
        plan_ms.append(iteration_ms(on_plan, scn))
        utils.append(max_util)
        bounds.append(bound)
    return Case(
        mix,
        load,
        statistics.median(ecmp_ms),
        statistics.median(plan_ms),
        statistics.median(utils),
        statistics.median(bounds),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="event time simulated")
    parser.add_argument("--quick", action="store_true", help="32 nodes, 2 seeds, no file")
    args = parser.parse_args()
    nodes, seeds = (32, 2) if args.quick else (args.nodes, args.seeds)
    started = time.perf_counter()
    lines = [
        f"C4P against ECMP in the simulator: {JOBS} jobs on {nodes} nodes "
        f"({nodes * GPUS_PER_NODE} GPUs), 1:1 fabric, medians over {seeds} placements",
        f"{'mix':<4}{'load':>12}{'ECMP ms':>10}{'C4P ms':>9}{'C4P gain':>10}"
        f"{'plan max util':>15}{'bound':>7}",
    ]
    for mix in ("dp", "3d"):
        for load in LOADS:
            case = run_case(nodes, mix, load, seeds, args.seconds)
            gain = case.ecmp_ms / case.plan_ms - 1
            lines.append(
                f"{mix:<4}{load:>12}{case.ecmp_ms:>10.1f}{case.plan_ms:>9.1f}{gain:>+10.0%}"
                f"{case.max_util:>15.2f}{case.bound:>7.2f}"
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines.append(
        "iteration time: median interval between a data-parallel group's iteration ends; "
        "gain: ECMP's time over C4P's;\nplan max util: every communicator's flows counted at "
        "once (a 3D job's port carries its ring and its pipeline pairs), as reroute plans them"
    )
    lines.append(f"wall time {time.perf_counter() - started:.0f} s, peak RSS {peak:.0f} MiB")
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        RESULTS.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The 3D-parallel scenario suite: the jobs people train, their faults, and their traps.

Megatron-style jobs over many (nodes, tp, pp, dp, ep, virtual stages) shapes: tensor-parallel
groups inside a node, a 1F1B pipeline (some interleaved, with a wrap-around pair) over
point-to-point pairs, data-parallel groups over the NIC ports,
MoE all-to-alls with a hot expert per iteration, the normal +-2% spread of GPU speed,
pipeline bubbles, checkpoint and evaluation pauses, data-loader stalls and job-wide
slowdowns. Each case has a kind: a fault (stuck pipeline stage, pipeline straggler, slow
expert GPU, GPU lost, data-parallel port degraded with or without error counters, port link
down, fabric link degraded or down under several jobs) or, for healthy runs, the trap it sets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from simulator.cluster import Cluster, build_cluster
from simulator.layout import coords, data_parallel_size
from simulator.noise import stream
from simulator.scenario import MIB, Scenario, scenario_from
from simulator.suite import shared_link

FAULT_KINDS = (
    "stuck_stage",
    "pipeline_straggler",
    "slow_expert",
    "gpu_lost",
    "port_degraded",
    "port_degraded_silent",
    "link_down",
    "fabric_link_degraded",
    "fabric_link_down",
)
TRAPS = ("moe_hot_expert", "gpu_spread", "pauses", "loader_stalls", "job_slowdown", "mixed")
HEALTHY_SHARE = 0.25
MAX_TRIES = 50


@dataclass(frozen=True, slots=True)
class Case:
    """One scenario of the suite and what it tests: a fault kind or a healthy trap."""

    scenario: Scenario
    kind: str
    healthy: bool


def generate_3d_suite(n_cases: int, seed: int, max_nodes: int = 16) -> list[Case]:
    """``n_cases`` varied 3D-parallel cases (deterministic by seed), healthy traps first."""
    if n_cases < 1 or max_nodes < 2:
        message = "a suite needs n_cases >= 1 and max_nodes >= 2"
        raise ValueError(message)
    healthy = round(n_cases * HEALTHY_SHARE) if n_cases > 1 else 0
    cases = []
    for index in range(n_cases):
        rng = stream(seed, "suite3d", str(index))
        name = f"case3d-{index:03d}"
        if index < healthy:
            trap = TRAPS[index % len(TRAPS)]
            cases.append(Case(_healthy(rng, name, index, trap, max_nodes), trap, True))
        else:
            kind = FAULT_KINDS[(index - healthy) % len(FAULT_KINDS)]
            cases.append(Case(_faulty(rng, name, index, kind, max_nodes), kind, False))
    return cases


def _shape(rng: random.Random, max_nodes: int, *, moe: bool, pp_min: int = 1) -> dict[str, Any]:
    """A job layout: tp inside a node, stages on whole nodes, dp (and ep) from the rest."""
    for _ in range(MAX_TRIES):
        tp = rng.choice((1, 2, 4, 8))
        pp = rng.choice([p for p in (1, 2, 4) if p >= pp_min])
        stage_nodes = rng.choice((1, 1, 2, 4))
        if pp * stage_nodes > max_nodes:
            continue
        dp = stage_nodes * 8 // tp
        eps = [e for e in (2, 4, 8) if dp % e == 0 and e <= dp]
        if moe and not eps:
            continue
        if dp < 2 and rng.random() < 0.7:
            continue  # a job without data parallelism is rare
        ep = rng.choice(eps) if moe else 1
        ranks = pp * stage_nodes * 8
        # Some pipelines interleaved (Megatron's virtual stages): microbatches by whole rounds.
        virtual = rng.choice((1, 1, 2, 3)) if pp > 1 else 1
        counts = [m for m in (4, 6, 8) if m >= pp and (virtual == 1 or m % pp == 0)]
        return {
            "ranks": ranks,
            "parallel": {
                "tp": tp,
                "pp": pp,
                "ep": ep,
                "virtual_stages": virtual,
                "microbatches": rng.choice(counts),
                "forward_ms": round(rng.uniform(15, 40), 1),
                "activation_bytes": rng.choice((8, 16, 32)) * MIB,
                "tp_bytes": rng.choice((4, 8, 16)) * MIB,
                "bucket_bytes": rng.choice((25, 50, 100)) * MIB,
                "dp_buckets": rng.choice((2, 4)),
                "a2a_bytes": rng.choice((2, 4, 8)) * MIB,
                "hot_expert_load": round(rng.uniform(0.3, 1.5), 2) if moe else 0.0,
                "gpu_spread": 0.02,
            },
        }
    message = "no 3D shape fits the suite's node limit"
    raise ValueError(message)


def _job(rng: random.Random, job_id: str, max_nodes: int, **how: Any) -> dict[str, Any]:
    job = {"id": job_id, "jitter": round(rng.uniform(0.005, 0.015), 4)}
    job |= _shape(rng, max_nodes, **how)
    return job


def _base(rng: random.Random, name: str, index: int, duration: float) -> dict[str, Any]:
    return {
        "name": name,
        "seed": index,
        "duration_s": round(duration, 1),
        "interval_s": 1.0,
        "emit_routes": True,
        "fabric": {"nodes_per_leaf": rng.choice((2, 4, 4)), "spines": rng.choice((2, 4, 8))},
        "jobs": [],
    }


def _healthy(rng: random.Random, name: str, index: int, trap: str, max_nodes: int) -> Scenario:
    duration = rng.uniform(40, 55)
    case = _base(rng, name, index, duration)
    moe = trap == "moe_hot_expert" or (trap == "mixed" and rng.random() < 0.5)
    jobs = [_job(rng, "job-1", max_nodes, moe=moe)]
    if trap == "mixed":
        jobs.append(_job(rng, "job-2", max(2, max_nodes // 2), moe=not moe))
    if trap == "gpu_spread":
        jobs[0]["parallel"]["gpu_spread"] = 0.02
        jobs[0]["jitter"] = 0.02
    if trap == "loader_stalls":
        jobs[0]["parallel"]["loader_stall"] = round(rng.uniform(0.01, 0.05), 3)
    case["jobs"] = jobs
    if trap in ("pauses", "mixed"):
        # Checkpoints and evaluation runs: every rank stops issuing work for a while.
        case["checkpoints"] = [
            {"job": rng.choice(jobs)["id"], "at_s": round(at, 2), "pause_s": round(pause, 2)}
            for at, pause in ((rng.uniform(8, 15), rng.uniform(2, 8)), (rng.uniform(25, 32), 3))
        ]
    if trap in ("job_slowdown", "mixed"):
        start = rng.uniform(10, 25)
        case["slowdowns"] = [
            {
                "job": "job-1",
                "at_s": round(start, 2),
                "until_s": round(start + rng.uniform(5, 12), 2),
                "factor": round(rng.uniform(1.1, 1.5), 3),
            }
        ]
    return scenario_from(case, name)


def _faulty(rng: random.Random, name: str, index: int, kind: str, max_nodes: int) -> Scenario:
    onset = round(rng.uniform(12, 18), 2)
    duration = onset + rng.uniform(28, 34)
    for _ in range(MAX_TRIES):
        case = _base(rng, name, index, duration)
        fabric = kind.startswith("fabric_")
        if fabric:
            count = rng.choice((2, 3))
            jobs = [
                _job(rng, f"job-{j + 1}", max(2, max_nodes // count), moe=rng.random() < 0.4)
                for j in range(count)
            ]
        else:
            pp_min = 2 if kind in ("stuck_stage", "pipeline_straggler") else 1
            jobs = [_job(rng, "job-1", max_nodes, moe=kind == "slow_expert", pp_min=pp_min)]
            if rng.random() < 0.3:
                jobs.append(_job(rng, "job-2", max(2, max_nodes // 4), moe=rng.random() < 0.5))
        case["jobs"] = jobs
        if rng.random() < 0.3:
            at = rng.choice((rng.uniform(4, onset - 6), rng.uniform(onset + 20, duration - 4)))
            pause = {"job": "job-1", "at_s": round(max(2.0, at), 2)}
            case["checkpoints"] = [pause | {"pause_s": round(rng.uniform(2, 5), 2)}]
        cluster = build_cluster(None, scenario_from(case, name))
        fault = _fault(rng, cluster, kind, onset)
        if fault is not None:
            case["faults"] = [fault]
            return scenario_from(case, name)
    message = f"{name}: found no target for {kind} in {MAX_TRIES} tries"
    raise ValueError(message)


def _fault(rng: random.Random, cluster: Cluster, kind: str, onset: float) -> dict[str, Any] | None:
    job = cluster.job("job-1")
    spec = job.spec
    shape = spec.parallel
    assert shape is not None  # noqa: S101 - the suite's jobs are all 3D
    dp = data_parallel_size(spec, shape)
    fault: dict[str, Any] = {"at_s": onset}
    if kind in ("stuck_stage", "pipeline_straggler"):
        # A rank of a middle stage where there is one: its neighbours wait on both sides.
        stages = list(range(1, shape.pp - 1)) or list(range(shape.pp))
        stage = rng.choice(stages)
        rank = rng.choice([r for r in range(spec.ranks) if coords(shape, dp, r).pp == stage])
        if kind == "stuck_stage":
            return fault | {"type": "process_stuck", "job": "job-1", "rank": rank}
        factor = round(rng.uniform(1.12, 1.5), 3)
        return fault | {"type": "slow_gpu", "job": "job-1", "rank": rank, "factor": factor}
    if kind == "slow_expert":
        rank = rng.randrange(spec.ranks)
        factor = round(rng.uniform(1.12, 1.5), 3)
        return fault | {"type": "slow_gpu", "job": "job-1", "rank": rank, "factor": factor}
    if kind == "gpu_lost":
        return fault | {"type": "gpu_stop", "job": "job-1", "rank": rng.randrange(spec.ranks)}
    if kind in ("port_degraded", "port_degraded_silent", "link_down"):
        # A port that carries data-parallel traffic over the fabric (and its pipeline's).
        carried = (comm.network() for comm in job.comms if comm.kind == "dp")
        used = sorted({str(conn.src_port) for ring in carried for conn in ring})
        if not used:
            return None
        node, _, port = rng.choice(used).partition("/")
        fault |= {"node": node, "port": port}
        if kind == "link_down":
            return fault | {"type": "link_down"}
        fault |= {"type": "port_degraded", "factor": round(rng.uniform(0.3, 0.6), 3)}
        if kind == "port_degraded_silent":
            fault["symbol_err_per_s"] = 0.0
        return fault
    link = shared_link(cluster, rng)
    if link is None:
        return None
    fault |= {"type": kind, "link": link}
    if kind == "fabric_link_degraded":
        fault["factor"] = round(rng.uniform(0.3, 0.6), 3)
    return fault

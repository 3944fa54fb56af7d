"""A generated scenario suite for scoring the detectors: every fault type, several job sizes,
single and concurrent faults, and healthy runs with jitter and checkpoints.

Cases are short (40-90 s of event time) so that hundreds simulate in minutes; the largest jobs
are few. Fault targets are drawn from the placed cluster, so every fault hits something: a
degraded fabric link is one that ring connections of at least two leaf pairs cross, the only
link they share.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from simulator.cluster import GPUS_PER_NODE, Cluster, build_cluster
from simulator.noise import stream
from simulator.scenario import FAULT_TYPES, MIB, Scenario, scenario_from

HEALTHY_SHARE = 0.18
CONCURRENT_SHARE = 0.15
LARGEST_SHARE = 0.04  # cases whose main job has the largest size (they cost the most)
BLIP_SHARE = 0.25  # cases with isolated symbol errors on healthy ports (real cables have them)
ROUTES = True  # the suite's fabric publishes its paths (a C4P-planned cluster)
MAX_TRIES = 50
FABRIC_FAULTS = ("fabric_link_degraded", "fabric_link_down")
JOB_FAULTS = ("slow_gpu", "gpu_stop", "process_stuck", "node_down", "port_degraded", "link_down")


class _Draw:
    """The random choices of one case."""

    def __init__(self, rng: random.Random, sizes: Sequence[int]) -> None:
        self.rng = rng
        self.sizes = sorted(sizes)

    def size(self, largest: bool, at_least: int = 2) -> int:
        """The largest size when asked (those cases are few), else one of the others."""
        choices = [s for s in self.sizes if s >= at_least] or [self.sizes[-1]]
        if largest:
            return choices[-1]
        return self.rng.choice(choices[:-1] or choices)

    def job(self, job_id: str, ranks: int) -> dict[str, Any]:
        rng = self.rng
        big = ranks >= 512
        job: dict[str, Any] = {
            "id": job_id,
            "ranks": ranks,
            "op_bytes": rng.choice((16, 32, 64, 128, 256)) * MIB,
            "compute_ms": round(rng.uniform(250, 400) if big else rng.uniform(120, 400), 1),
            "jitter": round(rng.uniform(0.005, 0.02), 4),
        }
        if ranks % GPUS_PER_NODE == 0 and rng.random() < 0.5:
            job["comms"] = ["dp", "tp"]
        if rng.random() < 0.15:
            job["dp_ops"] = ["allgather", "reducescatter"]
        return job


def generate_suite(
    n_cases: int, seed: int, sizes: Sequence[int] = (8, 64, 256, 1024)
) -> list[Scenario]:
    """``n_cases`` varied scenarios (deterministic by seed), healthy ones first."""
    if n_cases < 1 or not sizes or min(sizes) < 2:
        message = "a suite needs n_cases >= 1 and job sizes of at least 2 ranks"
        raise ValueError(message)
    healthy = max(1, round(n_cases * HEALTHY_SHARE)) if n_cases > 1 else 0
    concurrent = round(n_cases * CONCURRENT_SHARE)
    largest = max(1, round(n_cases * LARGEST_SHARE))
    cases: list[Scenario] = []
    for index in range(n_cases):
        rng = stream(seed, "suite", str(index))
        draw = _Draw(rng, sizes)
        allow_largest = index % max(1, n_cases // largest) == 0
        name = f"case-{index:03d}"
        if index < healthy:
            cases.append(_healthy(draw, name, index, allow_largest))
        elif index < healthy + concurrent:
            cases.append(_concurrent(draw, name, index))
        else:
            kind = FAULT_TYPES[(index - healthy - concurrent) % len(FAULT_TYPES)]
            cases.append(_single(draw, name, index, kind, allow_largest))
    return cases


def _base(draw: _Draw, name: str, index: int, duration: float) -> dict[str, Any]:
    rng = draw.rng
    case: dict[str, Any] = {
        "name": name,
        "seed": index,
        "duration_s": round(duration, 1),
        "interval_s": 1.0,
        "emit_routes": ROUTES,
        "fabric": {"nodes_per_leaf": rng.choice((2, 4, 4, 8)), "spines": rng.choice((2, 4, 8))},
        "jobs": [],
    }
    if rng.random() < BLIP_SHARE:
        case["port_error_blips"] = round(rng.uniform(1e-4, 5e-4), 6)
    return case


def _checkpoints(
    draw: _Draw, jobs: list[dict[str, Any]], duration: float, avoid: float | None
) -> list[dict[str, Any]]:
    """Zero to two checkpoint pauses, kept clear of the fault onset (pauses are not faults,
    and a hang that starts inside one would only be named later)."""
    rng = draw.rng
    found = []
    for _ in range(rng.choice((0, 1, 1, 2))):
        at = rng.uniform(5, duration - 12)
        if avoid is not None and avoid - 6 < at < avoid + 20:
            continue
        job = rng.choice(jobs)["id"]
        found.append({"job": job, "at_s": round(at, 2), "pause_s": round(rng.uniform(2, 8), 2)})
    return found


def _healthy(draw: _Draw, name: str, index: int, allow_largest: bool) -> Scenario:
    rng = draw.rng
    duration = rng.uniform(40, 60 if allow_largest else 90)
    case = _base(draw, name, index, duration)
    jobs = [draw.job("job-1", draw.size(allow_largest))]
    for extra in range(rng.choice((0, 0, 1, 2))):
        jobs.append(draw.job(f"job-{extra + 2}", draw.size(False)))
    case["jobs"] = jobs
    case["checkpoints"] = _checkpoints(draw, jobs, duration, None)
    return scenario_from(case, name)


def _single(draw: _Draw, name: str, index: int, kind: str, allow_largest: bool) -> Scenario:
    rng = draw.rng
    onset = round(rng.uniform(15, 25), 2)
    duration = onset + rng.uniform(35, 40 if allow_largest else 50)
    for _ in range(MAX_TRIES):
        case = _base(draw, name, index, duration)
        if kind in FABRIC_FAULTS:
            count = rng.choice((1, 2, 3))
            jobs = [draw.job(f"job-{j + 1}", draw.size(False, 64)) for j in range(count)]
        else:
            least = 16 if kind == "node_down" else 2
            jobs = [draw.job("job-1", draw.size(allow_largest, least))]
            for extra in range(rng.choice((0, 0, 1))):
                jobs.append(draw.job(f"job-{extra + 2}", draw.size(False)))
        case["jobs"] = jobs
        case["checkpoints"] = _checkpoints(draw, jobs, duration, onset)
        cluster = build_cluster(None, scenario_from(case, name))
        fault = _fault(draw, cluster, kind, "job-1", onset)
        if fault is not None:
            case["faults"] = [fault]
            return scenario_from(case, name)
    message = f"{name}: found no target for {kind} in {MAX_TRIES} tries"
    raise ValueError(message)


def _concurrent(draw: _Draw, name: str, index: int) -> Scenario:
    """Two or three jobs, each with its own fault, onsets close together."""
    rng = draw.rng
    onset = round(rng.uniform(15, 22), 2)
    duration = onset + rng.uniform(40, 50)
    case = _base(draw, name, index, duration)
    count = rng.choice((2, 2, 3))
    fabric = rng.random() < 0.2
    # Beside a degraded fabric link only stragglers: a hang would hide the link's slowdown.
    kinds = [rng.choice(("slow_gpu",) if fabric else JOB_FAULTS) for _ in range(count)]
    # A node_down needs a job of two nodes at least; a fabric link, jobs across leaves.
    least = [64 if fabric else 16 if kind == "node_down" else 2 for kind in kinds]
    jobs = [draw.job(f"job-{j + 1}", draw.size(False, least[j])) for j in range(count)]
    case["jobs"] = jobs
    case["checkpoints"] = _checkpoints(draw, jobs, duration, onset)
    cluster = build_cluster(None, scenario_from(case, name))
    faults = []
    for j, kind in enumerate(kinds):
        fault = _fault(draw, cluster, kind, f"job-{j + 1}", round(onset + rng.uniform(0, 8), 2))
        if fault is not None:
            faults.append(fault)
    if fabric:
        fault = _fault(draw, cluster, "fabric_link_degraded", "job-1", onset)
        if fault is not None:
            faults.append(fault)
    case["faults"] = faults
    return scenario_from(case, name)


def _fault(
    draw: _Draw, cluster: Cluster, kind: str, job_id: str, onset: float
) -> dict[str, Any] | None:
    rng = draw.rng
    job = cluster.job(job_id)
    rank = rng.randrange(job.spec.ranks)
    node, _, port = job.port_id(rank).partition("/")
    fault: dict[str, Any] = {"type": kind, "at_s": onset}
    if kind == "slow_gpu":
        fault |= {"job": job_id, "rank": rank, "factor": round(rng.uniform(1.1, 1.5), 3)}
    elif kind in ("gpu_stop", "process_stuck"):
        fault |= {"job": job_id, "rank": rank}
    elif kind == "node_down":
        if len(job.nodes) < 2:
            return None
        fault["node"] = rng.choice(job.nodes)
    elif kind == "port_degraded":
        fault |= {"node": node, "port": port, "factor": round(rng.uniform(0.3, 0.7), 3)}
    elif kind == "link_down":
        fault |= {"node": node, "port": port}
    else:
        link = shared_link(cluster, rng)
        if link is None:
            return None
        fault["link"] = link
        if kind == "fabric_link_degraded":
            fault["factor"] = round(rng.uniform(0.3, 0.7), 3)
    return fault


def shared_link(cluster: Cluster, rng: random.Random) -> str | None:
    """A fabric link that ring connections of two or more (unordered) leaf pairs cross."""
    leaf_of = {
        f"{node.id}/{port.id}": port.leaf for node in cluster.topology.nodes for port in node.ports
    }
    pairs: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for job in cluster.jobs:
        for comm in job.comms:
            for conn in comm.network():
                for link in conn.links:
                    pairs[link].add((leaf_of[str(conn.src_port)], leaf_of[str(conn.dst_port)]))
    # Two unordered leaf pairs through one link: only then do slow paths single it out (with
    # one pair, its uplink at one leaf and its downlink at the other are equally suspect).
    shared = sorted(
        link for link, crossing in pairs.items() if len({frozenset(p) for p in crossing}) >= 2
    )
    return rng.choice(shared) if shared else None

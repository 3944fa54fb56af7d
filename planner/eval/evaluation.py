"""Flow-level evaluation: max-min fair rates over directed links, jobs under ECMP and the plan.

The bandwidth model is progressive filling (water-filling): every unfrozen flow's rate rises
together; when a directed link fills, the flows crossing it freeze at that rate, and the rest
go on. A synchronous job (ring allreduce: a step ends when its slowest ring hop ends) is one
group: its flows rise and freeze together, so bandwidth its bottleneck cannot use stays with
the other jobs. A ring's bus bandwidth is then its hop rate, and a job's time per step is the
bytes of a hop over that rate.

ECMP is sampled: every flow draws a random source port (the sender's choice in RoCEv2) and
the source leaf's hash picks the spine, as in `topology.ecmp`; many seeds give the spread.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from planner.balance import Assignment
from planner.eval.traffic import Job, Workload
from planner.problem import Problem, build_problem
from schemas.files import Plan
from topology.ecmp import SPORT_MAX, SPORT_MIN, Ecmp, SwitchHash
from topology.model import Fabric


def max_min_rates(
    flow_links: Sequence[Sequence[int]],
    capacity: Sequence[float],
    groups: Sequence[int] | None = None,
) -> list[float]:
    """Max-min fair rate per group (default: per flow) of flows over capacitated links.

    ``flow_links[f]`` lists the links flow ``f`` crosses; ``groups[f]`` the group it belongs
    to (groups numbered from 0; a group's flows share one rate).
    """
    group_of = list(range(len(flow_links))) if groups is None else list(groups)
    count_groups = max(group_of, default=-1) + 1
    members: list[list[int]] = [[] for _ in range(count_groups)]
    for f, g in enumerate(group_of):
        members[g].append(f)
    users: dict[int, list[int]] = {}
    for f, links in enumerate(flow_links):
        for link in links:
            users.setdefault(link, []).append(f)
    count = {link: len(fs) for link, fs in users.items()}
    used = dict.fromkeys(users, 0.0)
    # The level of a link: the common rate at which it fills, given its frozen load.
    level = {link: capacity[link] / n for link, n in count.items()}
    heap = [(t, link) for link, t in level.items()]
    heapq.heapify(heap)
    rate = [0.0] * count_groups
    frozen = [False] * count_groups
    while heap:
        t, link = heapq.heappop(heap)
        if count[link] == 0 or level[link] != t:  # stale entry
            continue
        for f in users[link]:
            g = group_of[f]
            if frozen[g]:
                continue
            frozen[g] = True
            rate[g] = t
            for h in members[g]:
                for other in flow_links[h]:
                    n = count[other] - 1
                    count[other] = n
                    used[other] += t
                    if n:
                        new = (capacity[other] - used[other]) / n
                        level[other] = new
                        heapq.heappush(heap, (new, other))
    return rate


def flow_links(problem: Problem, spines: Sequence[int]) -> list[tuple[int, ...]]:
    """The directed links of every flow under a spine assignment (-1: within one leaf)."""
    uplinks = problem.fabric.uplinks
    out: list[tuple[int, ...]] = []
    for f, s in enumerate(spines):
        a, b = 2 * problem.src[f], 2 * problem.dst[f] + 1
        if s < 0:
            out.append((a, b))
        else:
            up = 2 * uplinks[problem.src_leaf[f]][s]
            down = 2 * uplinks[problem.dst_leaf[f]][s] + 1
            out.append((a, up, down, b))
    return out


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job's rate (its bus bandwidth, Gbps per ring or flow) and its time per step.

    A ring hop of several flows (queue pairs) runs at their summed rate."""

    job: str
    busbw_gbps: float
    seconds: float


def job_results(problem: Problem, spines: Sequence[int], jobs: Sequence[Job]) -> list[JobResult]:
    """Each job's bandwidth and step time when all jobs run at once on these paths."""
    group = [-1] * problem.size
    for j, job in enumerate(jobs):
        for f in job.flows:
            group[f] = j
    # Flows of no job are background traffic: each its own group after the jobs.
    extra = len(jobs)
    for f in range(problem.size):
        if group[f] < 0:
            group[f] = extra
            extra += 1
    rates = max_min_rates(flow_links(problem, spines), problem.fabric.directed_gbps, group)
    results = []
    for j, job in enumerate(jobs):
        r = rates[j]
        seconds = job.flow_bytes * 8 / (r * 1e9) if r > 0 else math.inf
        results.append(JobResult(job.id, r * job.flows_per_hop, seconds))
    return results


def max_util(problem: Problem, spines: Sequence[int]) -> float:
    """The contract's ``max_util`` of a spine assignment."""
    state = Assignment(problem)
    for f, s in enumerate(spines):
        if s >= 0:
            state.place(f, s)
    return state.max_util()


def plan_spines(problem: Problem, plan: Plan) -> list[int]:
    """The spine of every flow of a problem in a plan (-1 within one leaf)."""
    index = problem.fabric.spine_index
    via = {path.flow: path.via for path in plan.paths}
    return [-1 if via[flow] is None else index[str(via[flow])] for flow in problem.ids]


@dataclass(frozen=True, slots=True)
class EcmpSampler:
    """ECMP with random source ports: the hash state of every flow, computed once."""

    problem: Problem
    model: SwitchHash
    partials: tuple[int, ...]

    @classmethod
    def of(cls, problem: Problem, model: SwitchHash) -> EcmpSampler:
        """The sampler of a problem under a hash model."""
        ecmp = Ecmp(problem.fabric, model)
        partials = tuple(
            ecmp.partial(s, d) if spines else 0
            for s, d, spines in zip(problem.src, problem.dst, problem.cands, strict=True)
        )
        return cls(problem, model, partials)

    def sample(self, rng: random.Random) -> list[int]:
        """One ECMP outcome: a spine per flow (-1 within one leaf)."""
        finish, draw = self.model.finish, rng.randint
        out = []
        for partial, spines in zip(self.partials, self.problem.cands, strict=True):
            if spines:
                out.append(spines[finish(partial, draw(SPORT_MIN, SPORT_MAX)) % len(spines)])
            else:
                out.append(-1)
        return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """ECMP (per seed) and the plan, side by side, on one workload."""

    ecmp_max_util: tuple[float, ...]
    ecmp_jobs: tuple[tuple[JobResult, ...], ...]
    plan_max_util: float
    plan_jobs: tuple[JobResult, ...]


def compare(
    fabric: Fabric,
    load: Workload,
    plan: Plan,
    model: SwitchHash,
    util_seeds: Iterable[int],
    rate_seeds: Iterable[int],
    down: Iterable[str] = (),
) -> Comparison:
    """ECMP's ``max_util`` over ``util_seeds`` and job rates over ``rate_seeds``, and the plan's.

    With ``down`` links, ECMP groups shrink as a switch's would, and ``plan`` should be the
    replanned one.
    """
    problem = build_problem(fabric, load.flows, down)
    sampler = EcmpSampler.of(problem, model)
    # Seeded simulation draws, not secrets: the standard generator is the right tool.
    utils = tuple(
        max_util(problem, sampler.sample(random.Random(seed)))  # noqa: S311
        for seed in util_seeds
    )
    jobs = tuple(
        tuple(job_results(problem, sampler.sample(random.Random(seed)), load.jobs))  # noqa: S311
        for seed in rate_seeds
    )
    spines = plan_spines(problem, plan)
    return Comparison(
        ecmp_max_util=utils,
        ecmp_jobs=jobs,
        plan_max_util=max_util(problem, spines),
        plan_jobs=tuple(job_results(problem, spines, load.jobs)),
    )


def flow_rates(flow_links: Sequence[Sequence[int]], capacity: Sequence[float]) -> list[float]:
    """Max-min fair rate of every flow on its own: `max_min_rates` without groups, faster.

    The same progressive filling: the link that fills at the lowest common rate freezes its
    flows at that rate, and the links they also cross lose that much and one user. A link's
    level (capacity left over users left) only rises as flows freeze at or below it, so a
    heap entry is a lower bound: a popped link whose level has risen goes back in at its new
    level instead of being pushed at every change (many fewer heap operations).
    """
    size = len(capacity)
    users: list[list[int]] = [[] for _ in range(size)]
    for f, links in enumerate(flow_links):
        for link in links:
            users[link].append(f)
    count = [len(fs) for fs in users]
    left = [float(c) for c in capacity]
    heap = [(left[link] / n, link) for link, n in enumerate(count) if n]
    heapq.heapify(heap)
    rate = [-1.0] * len(flow_links)
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        t, link = pop(heap)
        n = count[link]
        if n == 0:
            continue
        level = left[link] / n
        if level > t:  # it rose since pushed: back in at its level
            push(heap, (level, link))
            continue
        for f in users[link]:
            if rate[f] >= 0:
                continue
            rate[f] = t
            for other in flow_links[f]:
                count[other] -= 1
                left[other] -= t
    return rate


def connection_rates(rates: Sequence[float], qps: int) -> list[float]:
    """The rate of each connection of ``qps`` consecutive queue-pair flows.

    The connection's bytes are split evenly over its queue pairs, so it ends when its slowest
    one does: its rate is ``qps`` times its slowest queue pair's rate.
    """
    return [qps * min(rates[c : c + qps]) for c in range(0, len(rates), qps)]


def low_percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank value at or below which ``fraction`` of the values lie (0.1: p10)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def links_max_util(
    flow_links: Sequence[Sequence[int]],
    gbps: Sequence[float],
    flows: Iterable[int],
    capacity: Sequence[float],
) -> float:
    """The largest directed-link utilisation of these flows alone, each at its demand."""
    load: dict[int, float] = {}
    for f in flows:
        g = gbps[f]
        for link in flow_links[f]:
            load[link] = load.get(link, 0.0) + g
    return max((x / capacity[link] for link, x in load.items()), default=0.0)


def iteration_ratio(
    phase_seconds: Sequence[float], ideal_seconds: Sequence[float], compute_ratio: float
) -> float:
    """A job's iteration time over its ideal one, in the benchmark's flow-level model.

    The model (not a packet simulator; no overlap of communication with compute, no
    congestion control, rates fixed for the whole phase): an iteration is its compute and
    then its phases one after another; a phase takes the bytes of one of its flows over the
    rate of its slowest flow (the collective waits for its slowest hop):

        iteration = compute + sum over phases of phase_seconds
        ideal     = compute + sum over phases of ideal_seconds (every flow at its line rate)
        compute   = compute_ratio x sum of ideal_seconds

    ``compute_ratio`` 0.1 is a communication-bound job, 1.0 a moderately communicating one.
    """
    ideal = sum(ideal_seconds)
    compute = compute_ratio * ideal
    if ideal <= 0:
        return 1.0
    return (compute + sum(phase_seconds)) / (compute + ideal)

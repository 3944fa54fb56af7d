"""C4P and its alternatives on training traffic, scored in one flow-level model.

Every method gives a spine per flow on the same `Problem` (a matrix's flows):
- ``c4p``: the product's plan, `plan` of the phased flows file (each phase planned apart,
  phases running one after another), after a failure `replan_choice` from the healthy plan
  (incremental: only the flows on the failed element move; ``best``: a few more moves for
  a lower ``max_util``);
- ``c4p-all``: `plan` of every flow at once, phases unknown (flows without ``phase``), as
  reroute planned running jobs before phases: it balances the phases' sum;
- ``ecmp``: a random source port per flow, hashed at the source leaf (`EcmpSampler`);
- ``ecmp-4qp`` / ``ecmp-8qp``: each connection split into 4 or 8 queue pairs, each its own
  random source port (Meta's E-ECMP); a connection runs at q x its slowest queue pair;
- ``spray``: a stand-in for flowlet switching and adaptive routing (per-packet-group
  spraying over the equal-cost paths, as E-ECMP and adaptive routing do): every flow split
  evenly over every spine, so a leaf's uplinks act as one link of their summed capacity (a
  fluid ideal: no reordering, no lag of the load signal; after a failure a leaf sprays over
  its usable uplinks, and a pair missing a spine at the far leaf is not modelled);
- ``greedy``: per phase, flows by demand each on the spine minimising the larger of its
  two link loads (`balance.least_loaded`), no colouring, no repair;
- ``bound``: `bound.problem_bound` per phase, the largest; its rates are the line-rate
  shares and its iteration the ideal one.

The score (`score`) runs each phase on its own, every job in it at once (jobs aligned, the
worst case): the largest link utilisation of any phase; per connection the max-min fair rate
(`evaluation.flow_rates`), reported as the worst and the 10th percentile; and each job's
iteration time over its ideal (`evaluation.iteration_ratio`), averaged over the jobs. This is
the benchmark's flow-level model, not a packet simulator.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TypeVar

from planner.balance import Assignment, least_loaded
from planner.bound import problem_bound
from planner.choice import ReplanMode, replan_choice
from planner.core import plan, replan
from planner.eval.evaluation import (
    EcmpSampler,
    connection_rates,
    flow_links,
    flow_rates,
    iteration_ratio,
    links_max_util,
    low_percentile,
)
from planner.eval.matrices import TrafficMatrix
from planner.problem import Problem, build_problem
from schemas.files import Flows, Plan
from topology.ecmp import SPORT_MAX, SPORT_MIN, SwitchHash
from topology.model import Fabric

METHODS = ("c4p", "c4p-all", "ecmp", "ecmp-4qp", "ecmp-8qp", "spray", "greedy", "bound")
COMM_BOUND, MODERATE = 0.1, 1.0  # compute as a share of the ideal communication time
SOURCE_PORTS = range(SPORT_MIN, SPORT_MAX + 1)  # the dynamic range RDMA stacks draw from
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Scores:
    """One method on one matrix (see the module doc); rates in Gbps, iterations / ideal."""

    max_util: float
    worst_gbps: float
    p10_gbps: float
    comm_bound: float
    moderate: float


def matrix_problem(fabric: Fabric, matrix: TrafficMatrix) -> Problem:
    """The planning problem of a matrix's flows, its down links avoided."""
    return build_problem(fabric, matrix.flows)


def split_queue_pairs(problem: Problem, qps: int) -> Problem:
    """Every flow as ``qps`` consecutive flows of ``1/qps`` its demand (same ports, spines)."""

    return Problem(
        fabric=problem.fabric,
        ids=_repeat(problem.ids, qps),  # a rate model: queue pairs need no ids of their own
        src=_repeat(problem.src, qps),
        dst=_repeat(problem.dst, qps),
        src_leaf=_repeat(problem.src_leaf, qps),
        dst_leaf=_repeat(problem.dst_leaf, qps),
        gbps=tuple(g / qps for g in problem.gbps for _ in range(qps)),
        cands=_repeat(problem.cands, qps),
        down=problem.down,
    )


def _repeat(column: Sequence[T], times: int) -> tuple[T, ...]:
    """Each item ``times`` times in a row: (a, b) twice is (a, a, b, b)."""
    return tuple(chain.from_iterable(zip(*(column,) * times, strict=True)))


def subproblem(problem: Problem, flows: Sequence[int]) -> Problem:
    """The problem of some of its flows (renumbered in the order given)."""
    return Problem(
        fabric=problem.fabric,
        ids=tuple(problem.ids[f] for f in flows),
        src=tuple(problem.src[f] for f in flows),
        dst=tuple(problem.dst[f] for f in flows),
        src_leaf=tuple(problem.src_leaf[f] for f in flows),
        dst_leaf=tuple(problem.dst_leaf[f] for f in flows),
        gbps=tuple(problem.gbps[f] for f in flows),
        cands=tuple(problem.cands[f] for f in flows),
        down=problem.down,
    )


def phase_inputs(matrix: TrafficMatrix) -> dict[str, Flows]:
    """Per phase, its flows as a planner input (the matrix's down links kept)."""
    items, down = matrix.flows.flows, matrix.flows.down
    return {
        name: Flows(v=1, kind="flows", flows=tuple(items[f] for f in flows), down=down)
        for name, flows in matrix.phase_flows().items()
    }


def c4p_plans(
    fabric: Fabric, matrix: TrafficMatrix, previous: Mapping[str, Plan] | None = None
) -> dict[str, Plan]:
    """C4P per phase; with the plans before a failure, the incremental replan of each."""
    plans = {}
    for name, flows in phase_inputs(matrix).items():
        before = previous.get(name) if previous is not None else None
        plans[name] = plan(fabric, flows) if before is None else replan(fabric, before, flows)
    return plans


def c4p_plan(
    fabric: Fabric,
    matrix: TrafficMatrix,
    previous: Plan | None = None,
    mode: ReplanMode = "incremental",
) -> Plan:
    """The product's plan of the phased flows; with the plan before a failure, its replan."""
    if previous is None:
        return plan(fabric, matrix.flows)
    return replan_choice(fabric, previous, matrix.flows, mode=mode).plan


def c4p_all_plan(fabric: Fabric, matrix: TrafficMatrix, previous: Plan | None = None) -> Plan:
    """C4P given every flow at once (phases unknown); replanned from ``previous`` if given."""
    flows = unphased(matrix.flows)
    if previous is None:
        return plan(fabric, flows)
    return replan(fabric, previous, flows)


def unphased(flows: Flows) -> Flows:
    """The flows without their phases: every flow competes with every other."""
    items = tuple(flow.model_copy(update={"phase": None}) for flow in flows.flows)
    return Flows(v=1, kind="flows", flows=items, down=flows.down)


def spray_links(problem: Problem) -> tuple[list[tuple[int, ...]], list[float]]:
    """Per flow its links when sprayed over every spine, and the capacities they index.

    An inter-leaf flow crosses its two cables and two bundles: its source leaf's usable
    uplinks as one link (numbered after the directed links, ``2 leaf``) and its destination
    leaf's downlinks (``2 leaf + 1``), each of their summed capacity.
    """
    fabric, down = problem.fabric, problem.down
    capacity = list(fabric.directed_gbps)
    base = len(capacity)
    bundles = [0.0] * (2 * len(fabric.uplinks))
    for leaf, ups in enumerate(fabric.uplinks):
        for link in ups.values():
            if link >= 0 and link not in down:
                bundles[2 * leaf] += capacity[2 * link]
                bundles[2 * leaf + 1] += capacity[2 * link + 1]
    links: list[tuple[int, ...]] = []
    for f, spines in enumerate(problem.cands):
        a, b = 2 * problem.src[f], 2 * problem.dst[f] + 1
        if spines:
            up, dn = base + 2 * problem.src_leaf[f], base + 2 * problem.dst_leaf[f] + 1
            links.append((a, up, dn, b))
        else:
            links.append((a, b))
    return links, capacity + bundles


def spray_scores(problem: Problem, matrix: TrafficMatrix) -> Scores:
    """The scores of spraying every flow over every equal-cost path (see the module doc)."""
    links, capacity = spray_links(problem)
    return score_links(problem, matrix, links, capacity)


def plan_spines_of(problem: Problem, plans: Iterable[Plan]) -> list[int]:
    """The spine of every flow of the problem in these plans together (-1 within a leaf)."""
    via: dict[str, str | None] = {}
    for result in plans:
        for path in result.paths:
            via[path.flow] = path.via
    index = problem.fabric.spine_index
    out = []
    for flow in problem.ids:
        spine = via[flow]
        out.append(-1 if spine is None else index[spine])
    return out


def greedy_spines(problem: Problem, matrix: TrafficMatrix) -> list[int]:
    """Global greedy least-loaded placement, phase by phase (phases do not share time)."""
    spines = [-1] * problem.size
    for flows in matrix.phase_flows().values():
        state = Assignment(problem)
        least_loaded(state, flows)
        for f in flows:
            spines[f] = state.spine[f]
    return spines


def bound(problem: Problem, matrix: TrafficMatrix) -> float:
    """No spine assignment has a lower score ``max_util``: the largest phase bound."""
    phases = matrix.phase_flows().values()
    return max((problem_bound(subproblem(problem, flows)) for flows in phases), default=0.0)


def phase_max_util(problem: Problem, matrix: TrafficMatrix, spines: Sequence[int]) -> float:
    """The largest link utilisation of any one phase, every flow at its demand."""
    links, capacity = flow_links(problem, spines), problem.fabric.directed_gbps
    phases = matrix.phase_flows().values()
    return max((links_max_util(links, problem.gbps, f, capacity) for f in phases), default=0.0)


def score(problem: Problem, matrix: TrafficMatrix, spines: Sequence[int], qps: int = 1) -> Scores:
    """The scores of a spine per flow; with ``qps`` > 1 ``problem`` is the matrix's problem
    split by `split_queue_pairs` and ``spines`` has a spine per queue pair."""
    return score_links(
        problem, matrix, flow_links(problem, spines), problem.fabric.directed_gbps, qps
    )


def score_links(
    problem: Problem,
    matrix: TrafficMatrix,
    links: Sequence[Sequence[int]],
    capacity: Sequence[float],
    qps: int = 1,
) -> Scores:
    """`score` of flows given the links each crosses (indices into ``capacity``)."""
    connections = problem.size // qps
    rate = [0.0] * connections
    worst_util = 0.0
    for flows in matrix.phase_flows().values():
        members = [f * qps + q for f in flows for q in range(qps)]
        rates = flow_rates([links[x] for x in members], capacity)
        for f, r in zip(flows, connection_rates(rates, qps), strict=True):
            rate[f] = r
        worst_util = max(worst_util, links_max_util(links, problem.gbps, members, capacity))
    comm_bound, moderate = iteration_ratios(matrix, rate)
    return Scores(worst_util, min(rate), low_percentile(rate, 0.1), comm_bound, moderate)


def iteration_ratios(matrix: TrafficMatrix, rate: Sequence[float]) -> tuple[float, float]:
    """The mean over jobs of iteration / ideal, communication-bound and moderate."""
    demand = [flow.gbps for flow in matrix.flows.flows]
    ratios: list[tuple[float, float]] = []
    for job in matrix.jobs:
        took, ideal = [], []
        for phase in job.phases:
            bits = phase.flow_bytes * 8
            took.append(bits / (min(rate[f] for f in phase.flows) * 1e9))
            ideal.append(bits / (min(demand[f] for f in phase.flows) * 1e9))
        ratios.append(
            (iteration_ratio(took, ideal, COMM_BOUND), iteration_ratio(took, ideal, MODERATE))
        )
    return statistics.mean(r[0] for r in ratios), statistics.mean(r[1] for r in ratios)


def ideal_scores(problem: Problem, matrix: TrafficMatrix) -> Scores:
    """The bound: ``max_util`` no plan beats, every connection at its line-rate share."""
    demand = [flow.gbps for flow in matrix.flows.flows]
    return Scores(bound(problem, matrix), min(demand), low_percentile(demand, 0.1), 1.0, 1.0)


def ecmp_scores(
    problem: Problem,
    matrix: TrafficMatrix,
    model: SwitchHash,
    seeds: Iterable[int],
    qps: int = 1,
) -> list[Scores]:
    """ECMP's scores per seed, each connection as ``qps`` queue pairs hashed independently."""
    base = EcmpSampler.of(problem, model)
    split = problem if qps == 1 else split_queue_pairs(problem, qps)
    # The hash state before the source port is per connection: compute it once, not per QP.
    partials = _repeat(base.partials, qps)
    sampler = EcmpSampler(split, model, partials)
    # Seeded simulation draws, not secrets: the standard generator is the right tool.
    return [
        score(split, matrix, sample_spines(sampler, random.Random(seed)), qps)  # noqa: S311
        for seed in seeds
    ]


def sample_spines(sampler: EcmpSampler, rng: random.Random) -> list[int]:
    """One ECMP outcome as `EcmpSampler.sample` draws it (a uniform source port per flow,
    hashed at the source leaf), the ports drawn in one call: several times faster."""
    sports = rng.choices(SOURCE_PORTS, k=len(sampler.partials))
    finish = sampler.model.finish
    return [
        spines[finish(partial, sport) % len(spines)] if spines else -1
        for partial, spines, sport in zip(
            sampler.partials, sampler.problem.cands, sports, strict=True
        )
    ]


def median_scores(samples: Sequence[Scores]) -> Scores:
    """Each score's median over samples (seeds), taken one score at a time."""
    return Scores(
        statistics.median(s.max_util for s in samples),
        statistics.median(s.worst_gbps for s in samples),
        statistics.median(s.p10_gbps for s in samples),
        statistics.median(s.comm_bound for s in samples),
        statistics.median(s.moderate for s in samples),
    )

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import plan
from planner.eval.evaluation import (
    Comparison,
    EcmpSampler,
    compare,
    job_results,
    max_min_rates,
)
from planner.eval.traffic import workload
from planner.problem import build_problem
from tests.unit.planner_cases import make_fabric
from topology import TopologyError
from topology.ecmp import hash_model
from topology.generate import Shape


def test_max_min_textbook_case() -> None:
    # Flow 0 crosses links 0 and 1, flow 1 link 1 only, flow 2 link 0 only.
    rates = max_min_rates([[0, 1], [1], [0]], [10.0, 4.0])
    assert rates == [2.0, 2.0, 8.0]


def test_a_group_freezes_together_and_leaves_the_rest_to_others() -> None:
    # Group 0 = flows 0 and 1; flow 1 shares a 2 Gbps link with flow 2 (group 1).
    rates = max_min_rates([[0], [1], [1, 2]], [10.0, 2.0, 10.0], groups=[0, 0, 1])
    assert rates == [1.0, 1.0]
    # Now group 1 is held at 2 by link 1; group 0 takes the rest of link 2 it shares.
    rates = max_min_rates([[0], [2], [1, 2]], [10.0, 2.0, 10.0], groups=[0, 0, 1])
    assert rates == [8.0, 2.0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True), max_size=12),
    st.lists(st.sampled_from([1.0, 2.0, 5.0, 10.0]), min_size=6, max_size=6),
)
def test_max_min_rates_are_feasible_and_every_flow_has_a_bottleneck(
    paths: list[list[int]], capacity: list[float]
) -> None:
    rates = max_min_rates(paths, capacity)
    load: defaultdict[int, float] = defaultdict(float)
    for path, rate in zip(paths, rates, strict=True):
        for link in path:
            load[link] += rate
    for link, total in load.items():
        assert total <= capacity[link] + 1e-9
    for f, path in enumerate(paths):
        # Max-min fair: some link of the flow is full and no flow on it gets more.
        assert any(
            math.isclose(load[link], capacity[link])
            and all(rates[g] <= rates[f] + 1e-9 for g, other in enumerate(paths) if link in other)
            for link in path
        )


def test_planned_rings_run_at_line_rate_and_ecmp_never_beats_a_plan_at_the_bound() -> None:
    fabric = make_fabric(Shape(nodes=32, spines=8, nics=2))
    load = workload(fabric, "ring", 2, seed=3)
    result = plan(fabric, load.flows)
    assert result.max_util == pytest.approx(1.0)
    comparison = compare(fabric, load, result, hash_model("crc32"), range(30), range(5))
    assert all(r.busbw_gbps == pytest.approx(200.0) for r in comparison.plan_jobs)
    assert min(comparison.ecmp_max_util) >= comparison.plan_max_util - 1e-9
    for jobs in comparison.ecmp_jobs:
        for ecmp, planned in zip(jobs, comparison.plan_jobs, strict=True):
            assert ecmp.busbw_gbps <= planned.busbw_gbps + 1e-9
            assert ecmp.seconds >= planned.seconds - 1e-12
    # A 16-node ring moving 1 GiB: 2 (n-1)/n of it, over 4 rings of 200 Gbps each.
    assert comparison.plan_jobs[0].seconds == pytest.approx(2 * 15 / 16 * 2**30 * 8 / (4 * 200e9))


def test_ecmp_samples_are_reproducible_per_seed() -> None:
    fabric = make_fabric(Shape(nodes=16, spines=4, nics=1))
    load = workload(fabric, "permutation", 1)
    sampler = EcmpSampler.of(build_problem(fabric, load.flows), hash_model("toeplitz"))
    assert sampler.sample(random.Random(5)) == sampler.sample(random.Random(5))
    assert sampler.sample(random.Random(5)) != sampler.sample(random.Random(6))


def test_workloads() -> None:
    fabric = make_fabric(Shape(nodes=16, spines=4, nics=2))
    for pattern in ("ring", "permutation"):
        load = workload(fabric, pattern, 4, seed=1)
        flows = load.flows.flows
        assert len(flows) == len(fabric.ports)  # every port sends once and receives once
        assert len({f.src for f in flows}) == len({f.dst for f in flows}) == len(flows)
        for flow in flows:
            assert fabric.ports[flow.src].node != fabric.ports[flow.dst].node
            assert fabric.plane_of(flow.src) == fabric.plane_of(flow.dst)
        assert sorted(f for job in load.jobs for f in job.flows) == list(range(len(flows)))
        results = job_results(
            build_problem(fabric, load.flows), [-1] * len(flows), load.jobs
        )  # everything as if on one leaf: the cables alone limit
        assert [r.busbw_gbps for r in results] == [200.0] * 4
    with pytest.raises(TopologyError, match="do not fit"):
        workload(fabric, "ring", 9)


def test_queue_pairs_split_each_hop_and_add_up_to_the_ring_rate() -> None:
    fabric = make_fabric(Shape(nodes=32, spines=8, nics=2))
    one = workload(fabric, "ring", 2, seed=3)
    four = workload(fabric, "ring", 2, seed=3, qps=4)
    assert len(four.flows.flows) == 4 * len(one.flows.flows)
    first = four.flows.flows[:4]
    assert [f.id for f in first] == [f"{one.flows.flows[0].id}/{q}" for q in range(4)]
    assert {(f.src, f.dst, f.gbps) for f in first} == {
        (one.flows.flows[0].src, one.flows.flows[0].dst, 50.0)
    }
    model, seeds = hash_model("crc32"), range(10)
    split = compare(fabric, four, plan(fabric, four.flows), model, [], seeds)
    whole = compare(fabric, one, plan(fabric, one.flows), model, [], seeds)
    for a, b in zip(split.plan_jobs, whole.plan_jobs, strict=True):
        assert a.busbw_gbps == pytest.approx(b.busbw_gbps) == pytest.approx(200.0)
        assert a.seconds == pytest.approx(b.seconds)

    def ecmp_mean(comparison: Comparison) -> float:
        return statistics.mean(r.busbw_gbps for jobs in comparison.ecmp_jobs for r in jobs)

    # Smaller flows, each hashed on its own: ECMP loses less than with one flow per hop.
    assert ecmp_mean(whole) < ecmp_mean(split) < 200.0
    with pytest.raises(TopologyError, match="qps must be at least 1"):
        workload(fabric, "ring", 2, qps=0)

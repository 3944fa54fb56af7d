from __future__ import annotations

import random
import statistics

import pytest

from planner.eval.baselines import (
    c4p_all_plan,
    c4p_plan,
    c4p_plans,
    ecmp_scores,
    greedy_spines,
    ideal_scores,
    matrix_problem,
    plan_spines_of,
    score,
    split_queue_pairs,
    spray_links,
    spray_scores,
)
from planner.eval.evaluation import (
    connection_rates,
    flow_rates,
    iteration_ratio,
    low_percentile,
    max_min_rates,
)
from planner.eval.matrices import Mix, fail, training_matrix
from tests.unit.planner_cases import make_fabric
from topology.ecmp import hash_model
from topology.generate import Shape

# Two nodes on two leaves, two rails, two spines as fast as a port: the two flows leaving a
# leaf collide under ECMP half the time, and then each gets half its line rate.
COLLIDE = Shape(nodes=2, spines=2, nics=2, nodes_per_leaf=1, port_gbps=200.0, uplink_gbps=200.0)


def test_per_flow_max_min_rates_on_a_hand_checked_case() -> None:
    # Flow 0 crosses links 0 and 1, flow 1 link 1 only, flow 2 link 0 only.
    assert flow_rates([[0, 1], [1], [0]], [10.0, 4.0]) == [2.0, 2.0, 8.0]
    # Three flows on link 0 (9), one of them also on link 1 (1): 1, then 4 and 4.
    assert flow_rates([[0, 1], [0], [0]], [9.0, 1.0]) == [1.0, 4.0, 4.0]
    # A connection of 2 queue pairs runs at twice its slower one.
    assert connection_rates([1.0, 4.0, 3.0, 3.0], 2) == [2.0, 6.0]


def test_per_flow_rates_match_the_grouped_model_without_groups() -> None:
    rng = random.Random(5)
    for _ in range(300):
        links = rng.randint(1, 8)
        capacity = [rng.choice([1.0, 2.0, 3.0, 5.0, 10.0]) for _ in range(links)]
        paths = [
            rng.sample(range(links), rng.randint(1, min(3, links)))
            for _ in range(rng.randint(0, 20))
        ]
        assert flow_rates(paths, capacity) == pytest.approx(max_min_rates(paths, capacity))


def test_low_percentile_is_the_nearest_rank() -> None:
    assert low_percentile([5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.1) == 1.0
    assert low_percentile([float(x) for x in range(20, 0, -1)], 0.1) == 2.0


def test_iteration_time_model_on_a_hand_checked_case() -> None:
    # Phases took 2 s and 1 s where line rate would take 1 s and 0.5 s (ideal 1.5 s).
    assert iteration_ratio([2.0, 1.0], [1.0, 0.5], 0.1) == pytest.approx(3.15 / 1.65)
    assert iteration_ratio([2.0, 1.0], [1.0, 0.5], 1.0) == pytest.approx(4.5 / 3.0)
    assert iteration_ratio([1.0, 0.5], [1.0, 0.5], 0.1) == pytest.approx(1.0)


def test_scores_of_a_hand_built_collision() -> None:
    fabric = make_fabric(COLLIDE)
    matrix = training_matrix(fabric, "dp", 1, seed=0, channels=1)
    problem = matrix_problem(fabric, matrix)
    assert problem.size == 4 and all(g == 200.0 for g in problem.gbps)
    # Both flows from the first node's leaf on spine 0, the two back on spines 0 and 1.
    backward = [f for f, flow in enumerate(matrix.flows.flows) if flow.id.endswith("1->0")]
    assert len(backward) == 2
    spines = [0] * 4
    spines[backward[1]] = 1
    result = score(problem, matrix, spines)
    assert result.max_util == pytest.approx(2.0)  # 400 Gbps on a 200 Gbps uplink
    assert result.worst_gbps == pytest.approx(100.0) and result.p10_gbps == pytest.approx(100.0)
    # One dp phase at half rate: 2x its ideal time, plus compute of 0.1x or 1x the ideal.
    assert result.comm_bound == pytest.approx((0.1 + 2.0) / 1.1)
    assert result.moderate == pytest.approx((1.0 + 2.0) / 2.0)


def test_queue_pair_scaling_lowers_ecmp_collisions() -> None:
    fabric = make_fabric(COLLIDE)
    matrix = training_matrix(fabric, "dp", 1, seed=0, channels=1)
    problem = matrix_problem(fabric, matrix)
    split = split_queue_pairs(problem, 8)
    assert split.size == 32 and split.gbps[:8] == (25.0,) * 8
    model, seeds = hash_model("crc32"), range(40)
    single = ecmp_scores(problem, matrix, model, seeds)
    eight = ecmp_scores(problem, matrix, model, seeds, qps=8)
    assert max(s.max_util for s in single) == pytest.approx(2.0)  # a collision happens
    assert statistics.mean(s.max_util for s in eight) < statistics.mean(s.max_util for s in single)
    assert statistics.mean(s.worst_gbps for s in eight) > statistics.mean(
        s.worst_gbps for s in single
    )
    assert statistics.mean(s.comm_bound for s in eight) < statistics.mean(
        s.comm_bound for s in single
    )


@pytest.mark.parametrize("mix", ["dp", "3d", "moe"])
def test_plan_is_no_worse_than_any_baseline_and_greedy_no_better_than_the_bound(
    mix: Mix,
) -> None:
    fabric = make_fabric(Shape(nodes=32, spines=4, nics=2, nodes_per_leaf=4))
    matrix = training_matrix(fabric, mix, 2, seed=9)
    problem = matrix_problem(fabric, matrix)
    planned = score(problem, matrix, plan_spines_of(problem, c4p_plans(fabric, matrix).values()))
    joint = score(problem, matrix, plan_spines_of(problem, [c4p_all_plan(fabric, matrix)]))
    greedy = score(problem, matrix, greedy_spines(problem, matrix))
    bound = ideal_scores(problem, matrix)
    model = hash_model("crc32")
    ecmp = [s for q in (1, 4) for s in ecmp_scores(problem, matrix, model, range(4), q)]
    assert greedy.max_util >= bound.max_util - 1e-9
    assert planned.max_util >= bound.max_util - 1e-9
    for other in (joint, greedy, *ecmp):
        assert planned.max_util <= other.max_util + 1e-9
    assert 1.0 <= planned.comm_bound <= min(s.comm_bound for s in ecmp)
    assert bound.comm_bound == 1.0 and bound.worst_gbps == min(
        flow.gbps for flow in matrix.flows.flows
    )


def test_spraying_splits_a_leaf_s_flows_over_its_uplinks_as_one_link() -> None:
    # The COLLIDE fabric: two flows leave leaf 0 over two 200G uplinks; sprayed, they never
    # collide (ECMP's worst case puts both on one uplink at 2.0).
    fabric = make_fabric(COLLIDE)
    matrix = training_matrix(fabric, "dp", 1, seed=1, channels=1)
    problem = matrix_problem(fabric, matrix)
    links, capacity = spray_links(problem)
    inter = [f for f, spines in enumerate(problem.cands) if spines]
    assert inter
    for f in inter:
        bundle = links[f][1]
        assert bundle >= len(fabric.directed_gbps)
        assert capacity[bundle] == pytest.approx(400.0)  # both uplinks of the leaf
    sprayed = spray_scores(problem, matrix)
    assert sprayed.max_util == pytest.approx(1.0)
    assert sprayed.comm_bound == pytest.approx(1.0)


@pytest.mark.parametrize("mix", ["3d", "moe"])
def test_the_product_plan_of_phased_flows_is_at_the_per_phase_bound(mix: Mix) -> None:
    fabric = make_fabric(Shape(nodes=32, spines=4, nics=2, nodes_per_leaf=4))
    matrix = training_matrix(fabric, mix, 2, seed=9)
    assert all(flow.phase is not None for flow in matrix.flows.flows)
    problem = matrix_problem(fabric, matrix)
    product = c4p_plan(fabric, matrix)
    planned = score(problem, matrix, plan_spines_of(problem, [product]))
    unphased = score(problem, matrix, plan_spines_of(problem, [c4p_all_plan(fabric, matrix)]))
    bound = ideal_scores(problem, matrix)
    assert planned.max_util == pytest.approx(bound.max_util)
    assert product.max_util == pytest.approx(bound.max_util)
    assert unphased.max_util > planned.max_util  # phases counted together: their sum
    # After a spine is lost the replan moves only what crossed it and sprayed flows lose a
    # share of their leaf's uplinks, never a whole one.
    failed = fail(fabric, matrix, "spine", seed=3)
    after = c4p_plan(fabric, failed, product)
    problem_after = matrix_problem(fabric, failed)
    replanned = score(problem_after, failed, plan_spines_of(problem_after, [after]))
    assert replanned.max_util >= ideal_scores(problem_after, failed).max_util - 1e-9
    assert spray_scores(problem_after, failed).max_util <= replanned.max_util + 1e-9

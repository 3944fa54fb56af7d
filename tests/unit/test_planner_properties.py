from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import Counter

from hypothesis import given, settings

from planner import lower_bound, plan
from planner.eval.evaluation import max_util
from planner.problem import build_problem
from schemas.files import Flows
from tests.unit.planner_cases import check_plan, instances, make_fabric, make_flows, random_instance
from topology.generate import Shape
from topology.model import Fabric

CLOSE = {"rel_tol": 1e-9, "abs_tol": 1e-12}


@settings(max_examples=150, deadline=None)
@given(instances(equal=False, with_down=True))
def test_every_path_is_valid_and_avoids_down_links(case: tuple[Fabric, Flows]) -> None:
    fabric, flows = case
    result = plan(fabric, flows)
    check_plan(fabric, flows, result)
    assert result.max_util >= lower_bound(fabric, flows) - 1e-9


@settings(max_examples=50, deadline=None)
@given(instances(equal=False, vary_caps=True))
def test_paths_valid_with_unequal_capacities(case: tuple[Fabric, Flows]) -> None:
    fabric, flows = case
    result = plan(fabric, flows)
    check_plan(fabric, flows, result)
    assert result.max_util >= lower_bound(fabric, flows) - 1e-9


@settings(max_examples=300, deadline=None)
@given(instances(equal=True, enough_spines=True))
def test_equal_flows_with_enough_spines_are_collision_free_at_the_bound(
    case: tuple[Fabric, Flows],
) -> None:
    fabric, flows = case
    result = plan(fabric, flows)
    check_plan(fabric, flows, result)
    assert math.isclose(result.max_util, lower_bound(fabric, flows), **CLOSE)
    # König: as many spines as the largest leaf degree, so no fabric link carries two flows.
    crossings = Counter(
        (link, k) for path in result.paths if path.via for k, link in enumerate(path.links[1:3])
    )
    assert max(crossings.values(), default=0) <= 1


@settings(max_examples=300, deadline=None)
@given(instances(equal=True))
def test_equal_flows_meet_the_lower_bound_whatever_the_spines(case: tuple[Fabric, Flows]) -> None:
    fabric, flows = case
    result = plan(fabric, flows)
    assert math.isclose(result.max_util, lower_bound(fabric, flows), **CLOSE)


def test_gap_to_the_bound_otherwise_is_small() -> None:
    lines = []
    for kind in ("unequal", "down", "caps"):
        gaps = []
        for seed in range(120):
            fabric, flows = random_instance(seed, kind)
            bound = lower_bound(fabric, flows)
            gaps.append(plan(fabric, flows).max_util / bound if bound else 1.0)
        at_bound = sum(gap <= 1 + 1e-9 for gap in gaps)
        lines.append(
            f"{kind:8} at bound {at_bound}/{len(gaps)}  mean gap {statistics.mean(gaps):.4f}  "
            f"max gap {max(gaps):.3f}"
        )
        assert statistics.mean(gaps) <= 1.05
        assert max(gaps) <= 2.5
    print("\nplan max_util / lower bound:\n" + "\n".join(lines))


def test_plan_is_optimal_on_tiny_instances_by_exhaustive_search() -> None:
    exact = total = 0
    for seed in range(150):
        r = random.Random(seed)
        shape = Shape(
            nodes=r.randint(2, 8), spines=r.randint(2, 4), nics=1, planes=1, nodes_per_leaf=2
        )
        fabric = make_fabric(shape, [r.choice([100.0, 200.0, 400.0]) for _ in range(5)])
        ports = len(fabric.port_ids)
        pairs = [(r.randrange(ports), r.randrange(ports)) for _ in range(r.randint(2, 8))]
        flows = make_flows(fabric, pairs, [r.choice([25.0, 50.0, 100.0, 200.0]) for _ in range(4)])
        problem = build_problem(fabric, flows)
        inter = problem.inter_leaf()
        best = math.inf
        for choice in itertools.product(*(problem.cands[f] for f in inter)):
            spines = [-1] * problem.size
            for f, s in zip(inter, choice, strict=True):
                spines[f] = s
            best = min(best, max_util(problem, spines))
        found = plan(fabric, flows).max_util
        best = found if best == math.inf else best
        assert found <= 1.5 * best + 1e-9
        exact += found <= best + 1e-9
        total += 1
    print(f"\nplan optimal on {exact}/{total} tiny instances")
    assert exact >= 0.95 * total

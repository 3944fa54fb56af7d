"""The replan from a plan's standing state gives the full replan's plan, float for float."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import plan, replan, replan_choice, standing
from planner.choice import ReplanMode
from planner.eval.matrices import Failure, Mix, fail, training_matrix
from planner.standing import replan_fast
from schemas.files import Flows, Plan
from tests.unit.planner_cases import instances, make_fabric
from tests.unit.test_planner_replan import planned_with_a_failure
from topology.ecmp import SwitchHash, hash_model
from topology.generate import Shape
from topology.model import Fabric, UnreachableError

NODES = 64


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return make_fabric(Shape(nodes=NODES, spines=32))


def same_plan(fast: Plan, slow: Plan) -> None:
    assert fast.paths == slow.paths
    assert [type(p) for p in fast.paths] == [type(p) for p in slow.paths]
    assert fast.max_util == slow.max_util  # exactly: loads are summed in the same order
    assert fast.phases == slow.phases


@pytest.mark.parametrize("model", [None, "crc32"])
@pytest.mark.parametrize("failure", ["link", "port", "spine"])
@pytest.mark.parametrize("mix", ["dp", "3d", "moe"])
def test_replan_from_the_standing_state_is_the_full_replan(
    fabric: Fabric, mix: Mix, failure: Failure, model: str | None
) -> None:
    hashing = hash_model(model) if model else None
    healthy = training_matrix(fabric, mix, 4, seed=NODES)
    after = fail(fabric, healthy, failure, seed=NODES).flows
    before = plan(fabric, healthy.flows, (), hashing)
    assert replan_fast(fabric, before, after, (), hashing) is not None  # the fast path runs
    fast = replan(fabric, before, after, (), hashing)
    standing.forget()  # what follows is the full replan
    slow = replan(fabric, before, after, (), hashing)
    same_plan(fast, slow)


@pytest.mark.parametrize("mode", ["incremental", "best"])
@pytest.mark.parametrize("failure", ["link", "port", "spine"])
@pytest.mark.parametrize("mix", ["dp", "3d", "moe"])
def test_replan_choice_from_the_standing_state_is_the_full_one(
    fabric: Fabric, mix: Mix, failure: Failure, mode: ReplanMode
) -> None:
    """Bounds, misses and the few more moves of a phase left above its bound included."""
    healthy = training_matrix(fabric, mix, 4, seed=NODES)
    after = fail(fabric, healthy, failure, seed=NODES).flows
    before = plan(fabric, healthy.flows)
    fast = replan_choice(fabric, before, after, mode=mode)
    assert standing.recall(fast.plan) is not None  # made from the standing state
    standing.forget()
    slow = replan_choice(fabric, before, after, mode=mode)
    same_plan(fast.plan, slow.plan)
    assert (fast.strategy, fast.moved, fast.forced) == (slow.strategy, slow.moved, slow.forced)
    assert (fast.bound, fast.incremental_max_util) == (slow.bound, slow.incremental_max_util)
    assert (fast.utils, fast.bounds) == (slow.utils, slow.bounds)


def busiest(result: Plan, avoid: set[str]) -> str:
    count: dict[str, int] = {}
    for path in result.paths:
        for link in path.links[1:3] if path.via else ():
            count[link] = count.get(link, 0) + 1
    return min((-n, link) for link, n in count.items() if link not in avoid)[1]


@pytest.mark.parametrize("model", [None, "crc32"])
def test_failures_one_after_another_stay_the_full_replan(fabric: Fabric, model: str | None) -> None:
    """Each replan from the last one's state (derived, not rebuilt) matches the full one."""
    hashing: SwitchHash | None = hash_model(model) if model else None
    flows = training_matrix(fabric, "moe", 4, seed=3).flows
    fast = slow = plan(fabric, flows, (), hashing)
    down: set[str] = set()
    for _ in range(3):
        down.add(busiest(fast, down))
        failed = Flows(v=1, kind="flows", flows=flows.flows, down=tuple(sorted(down)))
        fast = replan(fabric, fast, failed, (), hashing)
        kept = standing.recall(fast)
        assert kept is not None
        standing.forget()
        slow = replan(fabric, slow, failed, (), hashing)
        same_plan(fast, slow)
        standing.remember(kept)


def test_a_link_back_up_or_other_flows_run_the_full_replan(fabric: Fabric) -> None:
    flows = training_matrix(fabric, "dp", 4, seed=5).flows
    before = plan(fabric, flows)
    link = busiest(before, set())
    failed = Flows(v=1, kind="flows", flows=flows.flows, down=(link,))
    after = replan(fabric, before, failed)
    assert replan_fast(fabric, after, flows, (), None) is None  # the link is back
    fewer = Flows(v=1, kind="flows", flows=flows.flows[1:], down=(link,))
    assert replan_fast(fabric, before, fewer, (), None) is None
    assert replan_fast(fabric, before, failed, (), hash_model("crc32")) is None


@settings(max_examples=150, deadline=None)
@given(instances(equal=False), st.data())
def test_unequal_demands_after_a_link_failure(
    case: tuple[Fabric, Flows], data: st.DataObject
) -> None:
    """Random fabrics and demands, where the moved flows' repair has work to do."""
    fabric, flows = case
    drawn = planned_with_a_failure(fabric, flows, data)
    if drawn is None:
        return
    before, failed = drawn
    try:
        fast = replan(fabric, before, flows, [failed])
    except UnreachableError:
        return  # the failed link was some flow's only way: the full replan said so
    standing.forget()
    same_plan(fast, replan(fabric, before, flows, [failed]))

"""The plan store against the real Redis: round trips, compare-and-set, one-line errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from actions.drivers.reroute.plan_store import (
    PlanStore,
    PlanStoreError,
    StalePlanError,
    StoreUnavailableError,
)
from planner.reroute import CurrentPlan, reroute
from tests.unit.test_reroute import JOBS, TS, diagnosis
from topology.ecmp import hash_model
from topology.generate import Shape, generate
from topology.model import Fabric

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_url: str, unique: str) -> Iterator[PlanStore]:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    prefix = f"test:{unique}:plan:"
    yield PlanStore(client, prefix)
    client.delete(*(client.keys(f"{prefix}*") or [f"{prefix}none"]))
    client.close()


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return Fabric.from_topology(generate(Shape(nodes=8, spines=4, nics=2, nodes_per_leaf=2)))


def first_plan(fabric: Fabric) -> CurrentPlan:
    model = hash_model("crc32")
    finding = diagnosis([("link", "leaf-0a~spine-a-0")])
    return reroute(fabric, JOBS, None, finding, TS, hash_model=model).current


def test_plan_round_trip_keeps_source_ports(store: PlanStore, fabric: Fabric) -> None:
    assert store.current() is None
    plan = first_plan(fabric)
    assert store.replace(plan, None).stored
    back = store.current()
    assert back == plan
    assert back is not None and all(
        type(a) is type(b) for a, b in zip(back.plan.paths, plan.plan.paths, strict=True)
    )
    assert store.history() == [plan.id]


def test_replace_is_a_compare_and_set(store: PlanStore, fabric: Fabric) -> None:
    first = first_plan(fabric)
    store.replace(first, None)
    assert not store.replace(first, None).stored  # a retry of the same plan: no-op
    second = reroute(
        fabric, JOBS, first, diagnosis([("port", "node-002/mlx5_0:1")], ident="d-2"), TS + 1
    )
    with pytest.raises(StalePlanError, match="no longer absent"):
        store.replace(second.current, None)
    assert store.replace(second.current, first.id).stored
    other = CurrentPlan("p-other", first.plan, (), TS + 2)
    with pytest.raises(StalePlanError, match=f"no longer {first.id}"):
        store.replace(other, first.id)  # another worker already moved on from first
    assert store.current() == second.current
    assert store.history() == [second.current.id, first.id]


def test_bad_contents_and_a_dead_redis_are_one_line_errors(
    store: PlanStore, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    client.hset(
        f"{store.prefix}current", mapping={"id": "p-1", "plan": "{}", "down": "[]", "ts_ns": "1"}
    )
    with pytest.raises(PlanStoreError, match=r"current holds no valid plan: \d+ validation error"):
        store.current()
    client.close()
    dead = PlanStore.from_url("redis://127.0.0.1:1/0", prefix=store.prefix)
    with pytest.raises(StoreUnavailableError, match="redis failed: ") as caught:
        dead.current()
    assert "\n" not in str(caught.value)
    dead.close()

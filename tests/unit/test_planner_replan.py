from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner import RoutedPath, moved_flows, plan, replan
from schemas.files import Flows, Plan
from tests.unit.planner_cases import check_plan, instances, make_fabric, make_flows
from topology.ecmp import choose_spine, hash_model
from topology.generate import Shape
from topology.model import Fabric, UnreachableError


def fabric_links_used(result_paths: tuple[object, ...]) -> list[str]:
    used: list[str] = []
    for path in result_paths:
        links = getattr(path, "links", ())
        if len(links) == 4:
            used += [link for link in links[1:3] if link not in used]
    return used


def planned_with_a_failure(
    fabric: Fabric, flows: Flows, data: st.DataObject
) -> tuple[Plan, str] | None:
    """The flows' plan and one fabric link it uses, drawn to fail; None when it uses none."""
    before = plan(fabric, flows)
    used = fabric_links_used(before.paths)
    if not used:
        return None
    return before, data.draw(st.sampled_from(used))


@settings(max_examples=150, deadline=None)
@given(instances(equal=False), st.data())
def test_replan_moves_only_the_flows_that_crossed_the_failed_link(
    case: tuple[Fabric, Flows], data: st.DataObject
) -> None:
    fabric, flows = case
    drawn = planned_with_a_failure(fabric, flows, data)
    if drawn is None:
        return
    before, failed = drawn
    crossing = {path.flow for path in before.paths if failed in path.links}
    try:
        after = replan(fabric, before, flows, [failed])
    except UnreachableError as error:  # the failed link was some flow's only way
        assert "every path crosses a down link" in str(error)
        return
    check_plan(fabric, flows, after, [failed])
    assert set(moved_flows(before, after)) == crossing
    for old, new in zip(before.paths, after.paths, strict=True):
        if old.flow not in crossing:
            assert new is old  # the same object: unchanged paths are reused, not rebuilt


def test_new_flows_are_placed_and_removed_flows_dropped() -> None:
    fabric = make_fabric(Shape(nodes=32, spines=4, nics=1))
    ports = len(fabric.port_ids)
    pairs = [(i, (i + 18) % ports) for i in range(0, ports, 2)]
    first = make_flows(fabric, pairs[:10], [100.0])
    before = plan(fabric, first)
    second = make_flows(fabric, pairs[2:14], [100.0], first_id=2)
    after = replan(fabric, before, second)
    check_plan(fabric, second, after)
    kept = {path.flow: path for path in before.paths}
    for path in after.paths:
        if path.flow in kept:
            assert path is kept[path.flow]
    assert set(moved_flows(before, after)) == {f"f{i}" for i in range(10, 14)}


def test_replan_with_a_hash_keeps_or_recomputes_source_ports() -> None:
    fabric = make_fabric(Shape(nodes=32, spines=4, nics=2))
    ports = len(fabric.port_ids)
    pairs = [(i, (i + 36) % ports) for i in range(ports)]
    flows = make_flows(fabric, pairs, [200.0])
    model = hash_model("crc32")
    before = plan(fabric, flows, hash_model=model)
    failed = fabric_links_used(before.paths)[0]
    after = replan(fabric, before, flows, [failed], hash_model=model)
    check_plan(fabric, flows, after, [failed])
    for path in after.paths:
        assert isinstance(path, RoutedPath)
        flow = next(f for f in flows.flows if f.id == path.flow)
        assert choose_spine(fabric, model, flow.src, flow.dst, path.sport, [failed]) == path.via
    # Flows that did not move keep their path; their source port changes only where the
    # smaller ECMP group of the failed link's leaves no longer hashes it to the same spine.
    moved = set(moved_flows(before, after))
    reused = [new is old for old, new in zip(before.paths, after.paths, strict=True)]
    assert moved and any(reused)
    leaves = set(failed.split("~")[0:1])
    for old, same in zip(before.paths, reused, strict=True):
        if old.flow not in moved and not same:
            assert {fabric.ports[old.links[0]].leaf, fabric.ports[old.links[-1]].leaf} & leaves


def test_degraded_link_is_avoided_like_a_down_one() -> None:
    fabric = make_fabric(Shape(nodes=16, spines=2, nics=1))
    flows = make_flows(fabric, [(0, 16), (2, 18)], [100.0])
    before = plan(fabric, flows)
    degraded = before.paths[0].links[1]
    after = replan(fabric, before, flows, [degraded])
    assert degraded not in after.paths[0].links

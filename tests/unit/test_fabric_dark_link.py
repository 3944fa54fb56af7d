"""A fabric link that went dark is named ``link_down``, a degraded one ``link_degraded``: by
how far the paths over it fell (`streams.core.fabric`), carried by every slow path through
the hub's reports and snapshots."""

from __future__ import annotations

import pytest

from actions.config import parse_config
from actions.pipeline.policy import View, kept_out, plan
from schemas.messages import Diagnosis
from streams.core.fabric import CLASS_CHANGE_CHECKS, TIE_PATIENCE, FabricCorrelator, FabricHub
from streams.core.params import DetectorParams
from streams.core.slowpath import SlowPath, path_of, path_row
from streams.core.snapshot import decode_state, encode_state
from streams.core.stage import finding_key
from tests.unit.ring_job import MS, RingJob
from tests.unit.test_fabric_correlator import run, topology

LINK = "leaf-a0~spine-a-0"
TICK = 250_000_000
T0 = 1_000_000_000_000


def paths(fell_to: float | None) -> list[SlowPath]:
    """Two jobs' slow paths over spine-a-0 that share only ``LINK`` (leaf-a0's uplink)."""
    return [
        SlowPath("job-1", "job-1/c/0->1", "node-000/mlx5_0:1", "node-001/mlx5_0:1", "spine-a-0",
                 None, fell_to),
        SlowPath("job-2", "job-2/c/0->1", "node-002/mlx5_1:1", "node-003/mlx5_1:1", "spine-a-0",
                 None, fell_to),
    ]  # fmt: skip


def named(found: list[Diagnosis]) -> list[tuple[str, str, str]]:
    return [(d.state, d.class_, d.suspects[0].id) for d in found]


def feed(correlator: FabricCorrelator, fell_to: float | None, checks: int, start: int) -> list:
    found: list[Diagnosis] = []
    for i in range(checks):
        found += correlator.check(T0 + (start + i) * TICK, paths(fell_to))
    return found


@pytest.mark.parametrize(
    ("fell_to", "cls"),
    [(0.2, "link_down"), (0.05, "link_down"), (0.3, "link_degraded"), (0.6, "link_degraded")],
)
def test_a_link_is_dark_or_degraded_by_how_far_its_paths_fell(fell_to: float, cls: str) -> None:
    found = FabricCorrelator(topology()).check(T0, paths(fell_to))
    assert named(found) == [("firing", cls, LINK)]
    assert found[0].job is None and found[0].evidence["fell_to"] == fell_to


def test_paths_that_do_not_say_how_far_they_fell_name_a_degraded_link() -> None:
    found = FabricCorrelator(topology()).check(T0, paths(None))
    assert named(found) == [("firing", "link_degraded", LINK)]
    assert found[0].evidence["fell_to"] is None


def test_the_dark_share_is_a_detector_parameter() -> None:
    strict = FabricCorrelator(topology(), DetectorParams(dark_link_share=0.1))
    assert named(strict.check(T0, paths(0.2))) == [("firing", "link_degraded", LINK)]
    loose = FabricCorrelator(topology(), DetectorParams(dark_link_share=0.35))
    assert named(loose.check(T0, paths(0.3))) == [("firing", "link_down", LINK)]


def test_the_engine_gives_its_parameters_to_its_correlator() -> None:
    # c4 diagnose --params: the replay's correlator takes the dark share it is given.
    from streams.core.engine import Engine

    engine = Engine(DetectorParams(dark_link_share=0.1), topology=topology())
    assert named(engine.fabric.check(T0, paths(0.2))) == [("firing", "link_degraded", LINK)]


def test_a_degraded_link_that_goes_dark_is_named_again_and_back() -> None:
    correlator = FabricCorrelator(topology())
    assert named(feed(correlator, 0.5, 3, 0)) == [("firing", "link_degraded", LINK)]
    # A few checks of a crawl are not yet enough; one check of a share again starts over.
    assert feed(correlator, 0.2, CLASS_CHANGE_CHECKS - 1, 3) == []
    assert feed(correlator, 0.5, 1, 10) == []
    assert feed(correlator, 0.2, CLASS_CHANGE_CHECKS - 1, 11) == []
    went_dark = feed(correlator, 0.2, 1, 20)
    assert named(went_dark) == [("resolved", "link_degraded", LINK), ("firing", "link_down", LINK)]
    assert correlator.class_of(LINK) == "link_down" and correlator.open_keys() == [LINK]
    assert went_dark[1].evidence["fell_to"] == 0.2
    back = feed(correlator, 0.5, CLASS_CHANGE_CHECKS, 30)
    assert named(back) == [("resolved", "link_down", LINK), ("firing", "link_degraded", LINK)]
    # Quiet: the link resolves in the class it is named in now.
    quiet = [d for i in range(20) for d in correlator.check(T0 + (40 + i) * TICK, [])]
    assert named(quiet) == [("resolved", "link_degraded", LINK)]
    assert correlator.open_keys() == []


def test_a_dark_link_resolves_as_link_down() -> None:
    correlator = FabricCorrelator(topology())
    assert named(feed(correlator, 0.2, 2, 0)) == [("firing", "link_down", LINK)]
    quiet = [d for i in range(20) for d in correlator.check(T0 + (10 + i) * TICK, [])]
    assert named(quiet) == [("resolved", "link_down", LINK)]


def test_a_slow_path_row_round_trips_and_an_old_row_falls_back_to_unknown() -> None:
    path = paths(0.2)[0]
    assert path_of("job-1", path_row(path)) == path
    old = path_row(path)[:5]  # a worker or snapshot from before paths said how far they fell
    assert path_of("job-1", old).fell_to is None
    with pytest.raises(ValueError, match="5 or 6 fields"):
        path_of("job-1", ["job-1/c/0->1", "a", "b"])


def test_hub_state_with_and_without_the_fall_round_trips() -> None:
    hub = FabricHub(topology(), TICK)
    hub.update("job-1", paths(0.2)[:1])
    hub.update("job-2", paths(0.2)[1:])
    found = hub.advance(T0) + hub.advance(T0 + TICK)
    assert named(found) == [("firing", "link_down", LINK)]
    state = hub.state()
    copy = FabricHub(topology(), TICK)
    copy.restore(decode_state(encode_state(state)))
    assert copy.state() == state and copy.paths == hub.paths
    assert copy.correlator.class_of(LINK) == "link_down"
    # A snapshot written before: five fields a path, no class changes counted.
    older = {**state, "paths": {j: [row[:5] for row in rows] for j, rows in state["paths"].items()}}
    del older["contrary"]
    aged = FabricHub(topology(), TICK)
    aged.restore(decode_state(encode_state(older)))
    assert all(p.fell_to is None for ps in aged.paths.values() for p in ps)
    assert aged.correlator.class_of(LINK) == "link_down"  # the open finding is kept as it was


def test_a_fabric_link_down_belongs_to_no_node_a_ports_to_its_node() -> None:
    (dark,) = FabricCorrelator(topology()).check(T0, paths(0.2))
    assert dark.class_ == "link_down" and finding_key(dark) is None
    port = dark.model_copy(
        update={"suspects": (dark.suspects[0].model_copy(update={"type": "port",
                                                                 "id": "node-004/mlx5_2:1"}),)}
    )  # fmt: skip
    assert finding_key(port) is not None and finding_key(port).id == "node-004"


@pytest.mark.parametrize(("factor", "cls"), [(0.2, "link_down"), (0.5, "link_degraded")])
def test_jobs_paths_say_how_far_they_fell_from_the_samples_since(factor: float, cls: str) -> None:
    """Two jobs' rings slow over one link: its class from the very first finding (the
    samples from before the fall are not mixed in: a crawl never reads as half speed)."""
    conn = {7: (40, factor)}
    jobs = [
        RingJob(job="job-1", first_node=0, slow_conn=dict(conn), transfer_ns=20 * MS),
        RingJob(job="job-2", first_node=2, slow_conn=dict(conn), seed=2),
    ]
    fabric = [d for d in run(jobs) if d.job is None]
    assert fabric and fabric[0].state == "firing" and fabric[0].class_ == cls
    assert {d.class_ for d in fabric} == {cls}
    assert fabric[0].evidence["fell_to"] == pytest.approx(factor, abs=0.05)


def test_a_fabric_link_down_is_rerouted_and_kept_out_once_resolved() -> None:
    correlator = FabricCorrelator(topology())
    (dark,) = correlator.check(T0, paths(0.2))
    steps = plan(dark, View(), parse_config({})).steps
    assert [(s.action, s.target, s.kind) for s in steps][0] == ("reroute", LINK, "link")
    assert "alert" in [s.action for s in steps]
    (resolved,) = [d for i in range(20) for d in correlator.check(T0 + (1 + i) * TICK, [])]
    assert resolved.class_ == "link_down" and kept_out(resolved, "link")
    # A link_down told from the link's own state (no slow paths) is given back when it ends.
    told = resolved.model_copy(update={"evidence": {}})
    assert not kept_out(told, "link")


def test_the_one_uplink_left_beside_a_dark_one_is_the_squeeze_not_a_fault() -> None:
    # leaf-a0 has two uplinks: once one is dark, the other carries all the leaf's traffic
    # and its paths slow. No switch nor link is named for them (3D suite, case3d-182).
    correlator = FabricCorrelator(topology())
    assert named(correlator.check(T0, paths(0.2))) == [("firing", "link_down", LINK)]
    squeeze = [
        SlowPath(f"job-{j}", f"job-{j}/c/0->1", f"node-000/mlx5_{j % 8}:1",
                 f"node-001/mlx5_{j % 8}:1", "spine-a-1", None, 0.5)
        for j in range(3, 11)
    ]  # fmt: skip
    later = []
    for step in range(1, 2 * TIE_PATIENCE):  # long past the patience of a tie
        later += correlator.check(T0 + step * TICK, paths(0.2) + squeeze)
    assert later == []
    assert correlator.open_keys() == [LINK]

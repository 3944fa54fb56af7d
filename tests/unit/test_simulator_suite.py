"""The generated scenario suite: coverage of fault types, sizes, concurrency, healthy runs."""

from __future__ import annotations

from collections import Counter

from simulator import generate_suite, ground_truth
from simulator.cluster import build_cluster
from simulator.scenario import FAULT_TYPES


def test_full_suite_covers_what_the_scoring_needs() -> None:
    suite = generate_suite(300, 1)
    assert len(suite) == 300
    assert len({s.name for s in suite}) == 300
    healthy = [s for s in suite if not s.faults]
    assert len(healthy) >= 50
    assert any(s.checkpoints for s in healthy)
    types = Counter(f.type for s in suite for f in s.faults)
    assert set(types) == set(FAULT_TYPES) and min(types.values()) >= 20
    assert sum(1 for s in suite if len(s.faults) > 1) >= 20
    sizes = Counter(max(job.ranks for job in s.jobs) for s in suite)
    assert set(sizes) == {8, 64, 256, 1024}
    assert sizes[1024] < sizes[256]  # the costly ones are few
    assert all(40 <= s.duration_s <= 90 for s in suite)
    for s in suite:
        for fault in s.faults:
            assert 10 <= fault.at_s <= s.duration_s - 30  # time to see it before the end


def test_suite_is_deterministic_and_every_case_places() -> None:
    first = generate_suite(40, 3, sizes=(8, 64))
    again = generate_suite(40, 3, sizes=(8, 64))
    assert [s.model_dump() for s in first] == [s.model_dump() for s in again]
    assert [s.model_dump() for s in first] != [
        s.model_dump() for s in generate_suite(40, 4, (8, 64))
    ]
    for scenario in first:
        cluster = build_cluster(None, scenario)
        truth = ground_truth(None, scenario, cluster)
        assert len(truth) == len(scenario.faults)
        for item in truth:
            if item.type == "fabric_link_degraded":
                crossing = [
                    conn
                    for job in cluster.jobs
                    for comm in job.comms
                    for conn in comm.ring or ()
                    if item.suspect_id in conn.links
                ]
                assert len(crossing) >= 2

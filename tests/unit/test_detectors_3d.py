"""The detectors on the shapes people train: tensor-parallel groups in a node, a 1F1B
pipeline over point-to-point pairs, data-parallel groups over the NIC ports, MoE all-to-all.
Each case is simulated (simulator.pipeline) and replayed as `c4 diagnose` does."""

from __future__ import annotations

from typing import Any

from schemas.messages import Diagnosis
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import MIB, scenario_from
from streams.core.compute import ComputeTracker
from streams.core.engine import Engine

MS = 1_000_000


def _case(
    parallel: dict[str, Any], faults: list[dict[str, Any]], ranks: int = 32
) -> dict[str, Any]:
    return {
        "seed": 7,
        "duration_s": 36,
        "emit_routes": True,
        "fabric": {"nodes_per_leaf": 2, "spines": 4},
        "jobs": [
            {
                "id": "job-1",
                "ranks": ranks,
                "jitter": 0.01,
                "parallel": {"microbatches": 8, "forward_ms": 25.0, "gpu_spread": 0.02} | parallel,
            }
        ],
        "faults": faults,
    }


def _firing(case: dict[str, Any]) -> list[Diagnosis]:
    scenario = scenario_from(case)
    cluster = build_cluster(None, scenario)
    engine = Engine(topology=cluster.topology)
    found = [d for m in simulate_cluster(cluster, scenario) for d in engine.process(m)]
    found += engine.check(engine.now_ns)
    return [d for d in found if d.state == "firing"]


def _named(found: list[Diagnosis]) -> list[tuple[str, str]]:
    return [(d.class_, d.suspects[0].id) for d in found]


def test_a_stuck_stage_is_named_not_the_stages_waiting_for_it() -> None:
    # Rank 9 (stage 1 of 4, tp 2 x dp 4 per stage): its tensor-parallel peer waits in their
    # allreduce, both neighbouring stages wait on their pairs, the next stage's peers on
    # theirs; only rank 9 waits on nothing.
    stuck = {"type": "process_stuck", "job": "job-1", "rank": 9, "at_s": 14}
    found = _firing(_case({"tp": 2, "pp": 4}, [stuck]))
    assert _named(found) == [("noncomm_hang", "node-001/gpu1")]


def test_a_pipeline_straggler_is_named_once_and_the_ranks_it_delays_are_not() -> None:
    slow = {"type": "slow_gpu", "job": "job-1", "rank": 12, "factor": 1.2, "at_s": 10}
    found = _firing(_case({"tp": 4, "pp": 2}, [slow]))
    assert _named(found) == [("noncomm_slow", "node-001/gpu4")]


def test_the_busiest_expert_of_each_iteration_is_load_not_a_straggler() -> None:
    found = _firing(_case({"tp": 1, "pp": 2, "ep": 4, "hot_expert_load": 1.5}, []))
    assert found == []


def test_a_port_slow_in_every_group_it_carries_is_named_without_counters() -> None:
    # tp 8: a data-parallel group is a ring of two, a pipeline pair two connections; no
    # group has an outlier of its own, the port is slow against the whole job.
    degraded = {
        "type": "port_degraded",
        "node": "node-001",
        "port": "mlx5_3:1",
        "factor": 0.45,
        "symbol_err_per_s": 0,
        "at_s": 12,
    }
    found = _firing(_case({"tp": 8, "pp": 2, "activation_bytes": 32 * MIB}, [degraded]))
    assert _named(found) == [("comm_slow", "node-001/mlx5_3:1")]


def _window(tracker: ComputeTracker, start: int, ends: int, compute: dict[int, int]) -> None:
    """Every member in one op from ``start + compute`` to ``ends`` (a shared sync point)."""
    for rank, busy in compute.items():
        enter = start + busy
        tracker.add(rank, "c", ends, (ends // MS,), ("alltoall",), (4 * MIB,), (enter,), (ends,))


def _judged(length_ms: int, compute: dict[int, int]) -> ComputeTracker:
    """Ten windows of ``length_ms`` between sync points, each rank computing the same."""
    tracker = ComputeTracker(slice_ns=1_000 * MS)
    members = tuple(compute)
    t = 0
    for _ in range(10):
        end = t + length_ms * MS
        _window(tracker, t, end, compute)
        tracker.sync("c", members, [end] * len(members))
        t = end
    tracker.judge()
    return tracker


def test_compute_windows_name_the_rank_that_computes_longer() -> None:
    tracker = _judged(1_200, {0: 700 * MS, 1: 700 * MS, 2: 910 * MS, 3: 690 * MS})
    slow = tracker.slow_ranks(window=7, least=4, threshold=1.06)
    assert [s.global_rank for s in slow] == [2]
    assert 1.25 < slow[0].ratio < 1.35
    copy = ComputeTracker.restored(tracker.state())
    assert copy.state() == tracker.state()


def test_peers_that_barely_compute_judge_only_a_rank_well_beyond_the_floor() -> None:
    # A communication-bound group: the peers compute 1% of each window. Rank 2 computing 40%
    # is waited for (judged against the floor); rank 3 at 6% is not judged at all.
    tracker = _judged(1_000, {0: 10 * MS, 1: 10 * MS, 2: 400 * MS, 3: 60 * MS})
    slow = tracker.slow_ranks(window=7, least=4, threshold=1.06)
    assert [s.global_rank for s in slow] == [2]
    assert all(v[1] is None for v in tracker.verdicts[3])


def test_a_fabric_link_down_names_the_link_not_the_ports_of_the_node_behind_it() -> None:
    # The link's flows move onto the leaf's other uplinks: in the data-parallel ring of
    # job-3 the connections of the node behind that leaf slow, in each group on one of its
    # ports. No job-wide vote nor counter backs a port: the correlator names the link.
    mib = 1024 * 1024
    case = {
        "seed": 83,
        "duration_s": 32,
        "emit_routes": True,
        "jobs": [
            {"id": "job-1", "ranks": 8, "jitter": 0.0109, "parallel": {"tp": 4}},
            {
                "id": "job-2",
                "ranks": 32,
                "jitter": 0.0128,
                "parallel": {"tp": 2, "pp": 2, "ep": 4, "microbatches": 4, "hot_expert_load": 1.2},
            },
            {
                "id": "job-3",
                "ranks": 32,
                "jitter": 0.0148,
                "parallel": {
                    "tp": 8,
                    "microbatches": 4,
                    "forward_ms": 26.4,
                    "activation_bytes": 8 * mib,
                    "bucket_bytes": 100 * mib,
                    "dp_buckets": 2,
                },
            },
        ],
        "faults": [{"at_s": 16.61, "type": "fabric_link_down", "link": "leaf-1a~spine-a-3"}],
    }
    assert _named(_firing(case)) == [("link_down", "leaf-1a~spine-a-3")]  # dark: link_down


def test_the_ports_of_the_nodes_behind_a_link_that_went_down_are_not_named() -> None:
    # Every port of two nodes behind leaf-2a is slow job-wide once their uplink went down
    # and its flows moved onto the other one: four ports of one node at once are not four
    # port faults (no counter moves); the correlator names the link.
    case = {
        "seed": 137,
        "duration_s": 32,
        "emit_routes": True,
        "fabric": {"nodes_per_leaf": 2, "spines": 2},
        "jobs": [
            {"id": "job-1", "ranks": 8, "jitter": 0.0101, "parallel": {"tp": 4}},
            {
                "id": "job-2",
                "ranks": 64,
                "jitter": 0.0106,
                "parallel": {"tp": 8, "pp": 2, "microbatches": 6, "forward_ms": 25.3},
            },
        ],
        "faults": [{"at_s": 16.09, "type": "fabric_link_down", "link": "leaf-2a~spine-a-1"}],
    }
    assert _named(_firing(case)) == [("link_down", "leaf-2a~spine-a-1")]  # dark: link_down

"""Snapshots of detector state: a worker restored from one goes on as if never stopped.

The live worker writes these to a changelog-backed table; here the core alone is checked:
replay half a run, snapshot every job and node, restore into a fresh engine, replay the rest,
and compare with the uninterrupted replay; through the stage interface
(`streams.core.stage.DetectionStage`), as the live runtime drives it.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from schemas.base import C4Model
from schemas.files import Topology
from schemas.messages import Diagnosis, Route
from simulator import scenario_from, simulate
from simulator.cluster import build_cluster
from simulator.run import simulate_cluster
from simulator.scenario import FAULT_TYPES
from streams.core.engine import Engine
from streams.core.fabric import FabricHub
from streams.core.snapshot import (
    SnapshotError,
    base_key,
    decode_state,
    delete_snapshot,
    encode_state,
    is_part_key,
    read_snapshot,
    write_snapshot,
)
from streams.core.stage import JOB, NODE, DetectionStage
from tests.unit.suite_cases import suite_case

Finding = tuple[str, str, str, tuple[str, ...]]


def _findings(diagnoses: Iterable[Diagnosis]) -> list[Finding]:
    return sorted((d.id, d.state, d.class_, tuple(s.id for s in d.suspects)) for d in diagnoses)


def _run(stage: DetectionStage, messages: list[C4Model]) -> list[Diagnosis]:
    found = [d for m in messages for d in stage.on_message(m)]
    return found + stage.on_eof()


def _suite_case(kind: str) -> tuple[Topology, list[C4Model], float]:
    """A suite scenario with one fault of ``kind``: topology, messages, fault onset (s)."""
    scenario = suite_case(kind)
    cluster = build_cluster(None, scenario)
    messages = list(simulate_cluster(cluster, scenario))
    return cluster.topology, messages, scenario.faults[0].at_s


def _ts(message: C4Model) -> int:
    return int(getattr(message, "ts_ns", 0))


@pytest.mark.parametrize("kind", FAULT_TYPES)
def test_restored_engine_finds_what_the_uninterrupted_one_finds(kind: str) -> None:
    topology, messages, fault_at = _suite_case(kind)
    uninterrupted, first = Engine(topology=topology), Engine(topology=topology)
    # Stop just after the fault began: part of its evidence is before, part after.
    start = _ts(messages[0])
    split = next(i for i, m in enumerate(messages) if _ts(m) > start + int((fault_at + 1) * 1e9))
    expected = _run(uninterrupted, messages)
    before = [d for m in messages[:split] for d in first.on_message(m)]

    keys = first.keys(JOB) + first.keys(NODE)
    blobs = {key: encode_state(state) for key, state in first.snapshot(keys).items()}
    assert any(key.kind == JOB for key in blobs), "the run tracked no job before the split"
    assert set(blobs) == set(keys)  # every key held has a state

    restored = Engine(topology=topology)
    # Route plans are shared facts (a global table live), not per-job state: fed again.
    for message in messages[:split]:
        if isinstance(message, Route):
            restored.on_message(message)
    for key, blob in blobs.items():
        restored.restore(key, decode_state(blob))
    assert restored.keys(JOB) == first.keys(JOB)
    after = _run(restored, messages[split:])

    assert _findings(before + after) == _findings(expected)


def _hub_run(topology: Topology, messages: list[C4Model]) -> tuple[list[Diagnosis], FabricHub]:
    """Jobs in one engine, the correlator in a hub fed only by their changed slow paths."""
    jobs = Engine(topology=topology, local_fabric=False)
    hub = FabricHub(topology, jobs.params.tick_ns)
    found: list[Diagnosis] = []
    for message in messages:
        found.extend(jobs.process(message))
        for job, paths in jobs.drain_slow_paths().items():
            hub.update(job, paths)
        found.extend(hub.advance(jobs.now_ns))
    return found, hub


def test_a_remote_fabric_hub_names_what_the_local_correlator_names() -> None:
    topology, messages, _ = _suite_case("fabric_link_degraded")
    expected = _run(Engine(topology=topology), messages)
    found, _ = _hub_run(topology, messages)
    assert any(d.job is None for d in expected), "the scenario raised no fabric finding"
    assert _findings(found) == _findings(expected)


def test_hub_state_round_trips() -> None:
    topology, messages, _ = _suite_case("fabric_link_degraded")
    _, hub = _hub_run(topology, messages)
    assert hub.paths or hub.correlator.book.open_findings()
    copy = FabricHub(topology, hub.clock.tick_ns)
    copy.restore(decode_state(encode_state(hub.state())))
    assert copy.state() == hub.state()


@pytest.mark.parametrize("blob", [b"", b"not zlib", encode_state({})[:-3]])
def test_a_blob_that_is_no_snapshot_is_an_error(blob: bytes) -> None:
    with pytest.raises(SnapshotError):
        decode_state(blob)


def test_a_large_snapshot_is_written_in_parts_under_the_size_bound() -> None:
    """A state over the part bound goes in parts; every record stays under it."""
    table: dict[bytes, bytes] = {}
    state = {"ops": [[i * 7_919_357, i * 104_729] for i in range(20_000)]}  # ~100 KB zlib
    written = write_snapshot(table, b"job-1", state, max_part=16 * 1024)
    assert written == len(table) > 3
    assert all(len(value) <= 16 * 1024 for value in table.values())
    assert all(base_key(key) == b"job-1" for key in table)
    assert sum(is_part_key(key) for key in table) == written - 1
    assert read_snapshot(table, b"job-1") == state
    # A newer snapshot replaces the parts of the older one; a small one needs none.
    state["ops"].append([1, 2])
    write_snapshot(table, b"job-1", state, max_part=16 * 1024)
    assert len(table) == written and read_snapshot(table, b"job-1") == state
    write_snapshot(table, b"job-1", {"ops": []}, max_part=16 * 1024)
    assert list(table) == [b"job-1"] and read_snapshot(table, b"job-1") == {"ops": []}
    write_snapshot(table, b"job-1", state, max_part=16 * 1024)
    delete_snapshot(table, b"job-1")
    assert table == {} and read_snapshot(table, b"job-1") is None


def test_a_snapshot_with_a_missing_or_changed_part_is_an_error() -> None:
    state = {"ops": [[i * 7_919_357, i * 104_729] for i in range(20_000)]}
    for damage in ("drop", "change"):
        table: dict[bytes, bytes] = {}
        write_snapshot(table, b"node-1", state, max_part=16 * 1024)
        part = next(key for key in table if is_part_key(key))
        if damage == "drop":
            del table[part]
        else:
            value = bytearray(table[part])
            value[100] ^= 0xFF
            table[part] = bytes(value)
        with pytest.raises(SnapshotError):
            read_snapshot(table, b"node-1")
    with pytest.raises(SnapshotError, match="not a snapshot head"):
        read_snapshot({b"k": b"C4PARTS1{not json"}, b"k")


def test_a_real_128_rank_3d_job_state_goes_in_parts_and_comes_back() -> None:
    """The state of a 3D job of 16 nodes after 40 s is over what one Kafka record takes."""
    scenario = scenario_from(
        {
            "seed": 5,
            "duration_s": 40,
            "interval_s": 0.5,
            "jobs": [
                {"id": "job-3d", "ranks": 128, "parallel": {"tp": 8, "pp": 4, "ep": 2}},
            ],
        }
    )
    engine = Engine()
    for message in simulate(None, scenario):
        engine.process(message)
    state = engine.job_state("job-3d")
    assert state is not None
    table: dict[bytes, bytes] = {}
    written = write_snapshot(table, b"job-3d", state, max_part=64 * 1024)
    assert written > 2 and all(len(value) <= 64 * 1024 for value in table.values())
    restored = Engine()
    restored.restore_job("job-3d", read_snapshot(table, b"job-3d") or {})
    assert encode_state(restored.job_state("job-3d") or {}) == encode_state(state)

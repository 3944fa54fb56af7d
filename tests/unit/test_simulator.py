"""The cluster simulator: valid, ordered, deterministic v1 output and its ground truth."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from c4 import C4Error
from c4.settings import Settings
from c4.simulate_cmd import register
from schemas.base import C4Model
from schemas.codec import Rejection, decode, encode
from schemas.messages import Collective, Gpu, Job, Link, Route
from simulator import Scenario, Truth, ground_truth, scenario_from, simulate
from simulator.cluster import default_topology
from topology.traffic import ring_hops

S = 1_000_000_000
T0 = 1_733_130_000 * S


def run(document: dict[str, Any]) -> tuple[Scenario, list[C4Model]]:
    """The scenario of a document and every message of its run."""
    scenario = scenario_from(document)
    return scenario, list(simulate(None, scenario))


def case(*faults: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A small two-job scenario (job-1: 32 ranks on node-000..003, job-2: 16 ranks after)."""
    document: dict[str, Any] = {
        "seed": 5,
        "duration_s": 30,
        "jobs": [
            {"id": "job-1", "ranks": 32, "comms": ["dp", "tp"], "compute_ms": 150},
            {"id": "job-2", "ranks": 16, "compute_ms": 100, "op_bytes": 16 * 1024 * 1024},
        ],
        "faults": list(faults),
    }
    document.update(extra)
    return document


def collectives(messages: list[C4Model], job: str | None = None) -> list[Collective]:
    return [m for m in messages if isinstance(m, Collective) and (job is None or m.job == job)]


def durations(messages: list[C4Model], job: str, size: int) -> dict[int, dict[int, int]]:
    """Per seq of the job's communicator of ``size`` members: rank -> end - enter."""
    found: dict[int, dict[int, int]] = defaultdict(dict)
    for m in collectives(messages, job):
        if m.comm_size != size:
            continue
        for seq, enter, end in zip(m.ops.seq, m.ops.enter_ns, m.ops.end_ns, strict=True):
            if end is not None:
                found[seq][m.rank] = end - enter
    return found


EVERY_FAULT = case(
    {"type": "slow_gpu", "job": "job-1", "rank": 3, "factor": 1.3, "at_s": 8},
    {"type": "port_degraded", "node": "node-004", "port": "mlx5_2:1", "factor": 0.5, "at_s": 6},
    {"type": "link_down", "node": "node-005", "port": "mlx5_1:1", "at_s": 20},
    {"type": "gpu_stop", "job": "job-1", "rank": 20, "at_s": 24},
    {"type": "node_down", "node": "node-001", "at_s": 27},
    {"type": "fabric_link_degraded", "link": "leaf-0a~spine-a-0", "factor": 0.5, "at_s": 5},
    checkpoints=[{"job": "job-2", "at_s": 10, "pause_s": 3}],
    emit_routes=True,
    port_error_blips=0.01,
)


def test_every_message_is_valid_v1_and_round_trips() -> None:
    _, messages = run(EVERY_FAULT)
    kinds = {type(m) for m in messages}
    assert kinds == {Job, Route, Collective, Link, Gpu}
    for message in messages:
        data = encode(message)
        decoded = decode(data)
        assert not isinstance(decoded, Rejection), (decoded.reason, data[:200])
        assert encode(decoded) == data


def test_output_is_sorted_by_event_time_and_opens_with_the_jobs() -> None:
    scenario, messages = run(EVERY_FAULT)
    stamps = [m.ts_ns for m in messages]  # type: ignore[attr-defined]
    assert stamps == sorted(stamps)
    assert stamps[0] == scenario.start_ns == T0
    assert [m.job for m in messages[:2] if isinstance(m, Job)] == ["job-1", "job-2"]
    assert max(stamps) <= T0 + 30 * S


def test_job_message_places_ranks_and_names_comms() -> None:
    _, messages = run(case())
    job = next(m for m in messages if isinstance(m, Job) and m.job == "job-1")
    assert [(p.rank, p.node, p.gpu, p.port) for p in job.ranks[8:10]] == [
        (8, "node-001", 0, "mlx5_0:1"),
        (9, "node-001", 1, "mlx5_1:1"),
    ]
    sizes = sorted(len(members) for members in job.comms.values())
    assert sizes == [8, 8, 8, 8, 32]  # four tensor-parallel groups and the dp ring
    seen = {(m.comm, m.rank, m.global_rank) for m in collectives(messages, "job-1")}
    for comm, members in job.comms.items():
        for rank, global_rank in enumerate(members):
            assert (comm, rank, global_rank) in seen


def test_every_rank_reports_every_communicator_every_interval() -> None:
    _, messages = run(case())
    per_rank: dict[tuple[str, int], int] = defaultdict(int)
    for m in collectives(messages):
        per_rank[(m.comm, m.global_rank)] += 1
    counts = set(per_rank.values())
    assert len(per_rank) == 32 * 2 + 16 and counts <= {29, 30, 31}


def test_in_flight_ops_are_reported_again_completed() -> None:
    _, messages = run(case())
    open_ops: set[tuple[str, int, int]] = set()
    completed: set[tuple[str, int, int]] = set()
    for m in collectives(messages):
        for seq, end in zip(m.ops.seq, m.ops.end_ns, strict=True):
            key = (m.comm, m.rank, seq)
            (open_ops if end is None else completed).add(key)
    assert open_ops, "some operation spans an interval boundary"
    last_seq = max(seq for _, _, seq in open_ops)
    assert {key for key in open_ops if key[2] < last_seq - 2} <= completed


def test_ring_connections_carry_the_ring_bytes() -> None:
    _, messages = run(case())
    m = next(
        m for m in collectives(messages, "job-2") if m.conns is not None and m.conns.bytes[0] > 0
    )
    assert m.conns is not None
    # The ring goes rail by rail over the two nodes (topology.traffic): 0 8 1 9 ... 7 15.
    hops = dict(ring_hops([r // 8 for r in range(16)]))
    before = {b: a for a, b in hops.items()}
    assert m.conns.peer == (hops[m.rank], before[m.rank])
    assert m.conns.port == (f"mlx5_{m.rank % 8}:1",) * 2
    per_op = 2 * 15 * 16 * 1024 * 1024 // 16  # ring allreduce: 2(n-1)/n of the buffer
    assert m.conns.bytes[0] % per_op == 0
    gbps = 8 * m.conns.bytes[0] / m.conns.busy_ns[0]
    assert 150 < gbps <= 200  # a 200G port, a little measurement noise
    tp = next(m for m in collectives(messages, "job-1") if m.comm_size == 8)
    assert tp.conns is None  # NVLink inside the node: no NIC port to name


def test_link_counters_are_cumulative() -> None:
    _, messages = run(EVERY_FAULT)
    last: dict[tuple[str, str], dict[str, int]] = {}
    grew: set[tuple[str, str]] = set()
    for m in messages:
        if not isinstance(m, Link):
            continue
        counters = m.counters.model_dump()
        key = (m.node, m.port)
        if key in last:
            for name, value in counters.items():
                assert value >= last[key][name], (key, name)
            if counters["tx_bytes"] > last[key]["tx_bytes"] + 10**6:
                grew.add(key)
        last[key] = counters
    assert ("node-000", "mlx5_0:1") in grew
    assert ("node-000", "mlx5_0:2") not in grew  # port 2 carries no ring traffic


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    first = [encode(m) for m in run(EVERY_FAULT)[1]]
    again = [encode(m) for m in run(EVERY_FAULT)[1]]
    other = [encode(m) for m in run(EVERY_FAULT | {"seed": 6})[1]]
    assert first == again
    assert first != other


def test_ground_truth_names_the_part_and_the_classes() -> None:
    scenario = scenario_from(EVERY_FAULT)
    truth = [t.as_dict() for t in ground_truth(None, scenario)]
    assert [t["fault"] for t in truth] == [
        "slow_gpu#0",
        "port_degraded#1",
        "link_down#2",
        "gpu_stop#3",
        "node_down#4",
        "fabric_link_degraded#5",
    ]
    assert truth[0] == {
        "fault": "slow_gpu#0",
        "type": "slow_gpu",
        "job": "job-1",
        "onset_ns": T0 + 8 * S,
        "classes": ["noncomm_slow"],
        "suspect": {"type": "gpu", "id": "node-000/gpu3"},
    }
    assert truth[1]["suspect"] == {"type": "port", "id": "node-004/mlx5_2:1"}
    assert truth[1]["job"] == "job-2" and truth[1]["classes"] == ["comm_slow", "link_degraded"]
    assert truth[2]["classes"] == ["link_down", "comm_hang"]
    assert truth[3]["suspect"] == {"type": "gpu", "id": "node-002/gpu4"}
    assert truth[3]["classes"] == ["noncomm_hang", "gpu_fault"]
    assert truth[4]["suspect"] == {"type": "node", "id": "node-001"}
    assert truth[5]["job"] is None
    assert truth[5]["suspect"] == {"type": "link", "id": "leaf-0a~spine-a-0"}


def _command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="c4")
    register(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    code: int = args.handler(args, Settings())
    return code


def test_command_writes_messages_and_truth_beside_them(tmp_path: Path) -> None:
    scenario = tmp_path / "s.json"
    stuck = {"type": "process_stuck", "job": "job-2", "rank": 3, "at_s": 9}
    scenario.write_bytes(orjson.dumps(case(stuck)))
    out = tmp_path / "run.jsonl"
    assert _command(["--scenario", str(scenario), "--out", str(out), "--seed", "9"]) == 0
    lines = out.read_bytes().splitlines()
    assert all(not isinstance(decode(line), Rejection) for line in lines[:500])
    truth = (tmp_path / "run.jsonl.truth.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["fault"] for line in truth] == ["process_stuck#0"]
    same = tmp_path / "same.jsonl"
    _command(["--scenario", str(scenario), "--out", str(same), "--seed", "9"])
    assert same.read_bytes() == out.read_bytes()


def test_command_with_a_topology_file(tmp_path: Path) -> None:
    scenario = scenario_from(case())
    topology = tmp_path / "topo.json"
    topology.write_bytes(encode(default_topology(scenario)))
    document = tmp_path / "s.json"
    document.write_bytes(orjson.dumps(case()))
    out = tmp_path / "run.jsonl"
    truth = tmp_path / "t.jsonl"
    argv = ["--scenario", str(document), "--topology", str(topology), "--out", str(out)]
    assert _command([*argv, "--truth", str(truth)]) == 0
    assert truth.read_bytes() == b""  # no faults, no truth lines
    assert out.stat().st_size > 0


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{", "S: invalid JSON"),
        (b"[1]", "S: expected a JSON object"),
        (b'{"duration_s": 10, "jobs": []}', "S: jobs: Tuple should have at least 1 item"),
        (
            orjson.dumps(case({"type": "node_down", "node": "node-999", "at_s": 3})),
            "S: faults[0].node: unknown node 'node-999'",
        ),
        (
            orjson.dumps(case() | {"jobs": [{"id": "big", "ranks": 64}]}),
            "S: jobs[0]: 64 ranks need 8 free nodes, the topology has 6 left",
        ),
    ],
)
def test_command_errors_are_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    topology = tmp_path / "topo.json"
    topology.write_bytes(encode(default_topology(scenario_from(case()))))
    scenario = tmp_path / "s.json"
    scenario.write_bytes(content)
    out = tmp_path / "o.jsonl"
    argv = ["--scenario", str(scenario), "--topology", str(topology), "--out", str(out)]
    with pytest.raises(C4Error) as raised:
        _command(argv)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(expected.replace("S", str(scenario), 1)), message
    assert not out.exists()  # nothing written before the check


def test_command_rejects_a_bad_topology_file(tmp_path: Path) -> None:
    topology = tmp_path / "topo.json"
    topology.write_bytes(b'{"v": 1, "kind": "topology", "nodes": []}')
    scenario = tmp_path / "s.json"
    scenario.write_bytes(orjson.dumps(case()))
    with pytest.raises(C4Error, match=r"topo.json: switches: required field missing"):
        _command(["--scenario", str(scenario), "--topology", str(topology)])


def test_output_does_not_depend_on_the_process_hash_seed(tmp_path: Path) -> None:
    document = tmp_path / "s.json"
    document.write_bytes(orjson.dumps(EVERY_FAULT))
    script = (
        "import sys, hashlib; from simulator import parse_scenario, simulate; "
        "from schemas.codec import encode; "
        "s = parse_scenario(open(sys.argv[1], 'rb').read()); "
        "print(hashlib.sha256(b''.join(encode(m) for m in simulate(None, s))).hexdigest())"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", script, str(document)],
            capture_output=True,
            env=env,
            timeout=120,
            check=True,
        )
        digests.add(done.stdout)
    assert len(digests) == 1


@pytest.mark.parametrize("interval_s", [0.05, 0.25, 5.0])
def test_other_reporting_intervals_stay_sorted_and_valid(interval_s: float) -> None:
    link_down = {"type": "link_down", "node": "node-001", "port": "mlx5_0:1", "at_s": 6}
    document = {
        "duration_s": 12,
        "interval_s": interval_s,
        "jobs": [{"id": "j", "ranks": 16, "compute_ms": 30}],
        "faults": [link_down],
    }
    _, messages = run(document)
    stamps = [m.ts_ns for m in messages if isinstance(m, Collective | Link | Gpu | Job)]
    assert len(stamps) == len(messages) and stamps == sorted(stamps)
    assert all(not isinstance(decode(encode(m)), Rejection) for m in messages)
    beats = [m for m in collectives(messages) if m.global_rank == 0]
    assert len(beats) in (int(12 / interval_s), int(12 / interval_s) + 1)


def test_truth_lines_read_back_as_written() -> None:
    truths = ground_truth(None, scenario_from(EVERY_FAULT))
    assert [Truth.from_dict(orjson.loads(orjson.dumps(t.as_dict()))) for t in truths] == truths

"""Flight Recorder dumps -> v1 collective messages -> the detectors name the missing ranks."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from producers.flight_recorder import FlightRecorderError, convert, load_dump, op_name
from producers.flight_recorder import read_dump_folder as read_folder
from schemas.codec import decode, encode
from schemas.messages import Collective, Diagnosis, Job, RankPlace

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000_000_000_000
MS = 1_000_000


def run_c4(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args], input=stdin, capture_output=True, timeout=120
    )


def _entry(
    record_id: int,
    pg: tuple[str, str],
    seq: int,
    name: str,
    created: int,
    completed: int | None,
    p2p_seq: int = 0,
) -> dict[str, Any]:
    return {
        "record_id": record_id,
        "pg_id": 0,
        "process_group": pg,
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": record_id,
        "profiling_name": name,
        "time_created_ns": created,
        "time_discovered_started_ns": created if completed is not None else None,
        "time_discovered_completed_ns": completed,
        "state": "completed" if completed is not None else "started",
        "input_sizes": [[1024, 1024]],
        "input_dtypes": ["Float"],
        "output_sizes": [[1024, 1024]],
        "output_dtypes": ["Float"],
        "timeout_ms": 600_000,
        "is_p2p": " " in name,
        "retired": completed is not None,
        "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
    }


def write_hang_dumps(folder: Path, world: int = 4, missing: int = 2, steps: int = 20) -> None:
    """A hang: every rank does ``steps`` allreduces; then all but ``missing`` enter one more."""
    folder.mkdir()
    pg = ("0", "default_pg")
    for rank in range(world):
        entries = []
        for step in range(steps):
            start = T0 + step * 100 * MS + (30 * MS if rank == missing else 0)
            entries.append(
                _entry(step, pg, step + 1, "nccl:all_reduce", start, T0 + step * 100 * MS + 40 * MS)
            )
        # A point-to-point pair inside the job (0 -> 1), completed.
        if rank in (0, 1):
            name = "nccl:send 0->1" if rank == 0 else "nccl:recv 1<-0"
            entries.append(_entry(steps, pg, steps, name, T0 + 1990 * MS, T0 + 1995 * MS, 1))
        if rank != missing:
            hung = T0 + steps * 100 * MS
            entries.append(_entry(steps + 1, pg, steps + 1, "nccl:all_reduce", hung, None))
        dump = {
            "version": "2.4",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "pg_status": {"0": {"last_enqueued_collective": steps + (rank != missing)}},
            "nccl_version": "2.21.5",
            "entries": entries,
        }
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(dump))
        written = T0 + 40 * 1_000_000_000  # the watchdog's timeout dump, 40 s after the hang
        os.utime(path, ns=(written, written))


def test_crafted_hang_dumps_convert_and_diagnose_names_the_missing_rank(tmp_path: Path) -> None:
    write_hang_dumps(tmp_path / "dumps")
    placement = tmp_path / "job.json"
    places = [RankPlace(rank=r, node=f"node-00{r // 2}", gpu=r % 2) for r in range(4)]
    job = Job(
        v=1,
        kind="job",
        job="job-7",
        ts_ns=T0,
        state="running",
        ranks=tuple(places),
        comms={"0": (0, 1, 2, 3)},
    )
    placement.write_bytes(encode(job))

    converted = run_c4(
        "convert", "flight-recorder", str(tmp_path / "dumps"), "--placement", str(placement)
    )
    assert converted.returncode == 0, converted.stderr
    messages = [decode(line) for line in converted.stdout.splitlines()]
    assert all(isinstance(m, Collective) for m in messages)
    collectives = [m for m in messages if isinstance(m, Collective)]
    assert {m.job for m in collectives} == {"job-7"}
    world = [m for m in collectives if m.comm == "0"]
    assert {m.comm_size for m in world} == {4}
    # The hung allreduce (seq 21) is reported in flight by ranks 0, 1, 3 and never by rank 2.
    in_flight = {
        m.global_rank
        for m in world
        for s, e in zip(m.ops.seq, m.ops.end_ns, strict=True)
        if s == 21 and e is None
    }
    assert in_flight == {0, 1, 3}
    assert not any(21 in m.ops.seq for m in world if m.global_rank == 2)
    # Every rank keeps reporting (heartbeats) until it wrote its dump.
    assert {m.global_rank for m in world if m.ts_ns >= T0 + 39 * 1_000_000_000} == {0, 1, 2, 3}
    pair = [m for m in collectives if m.comm == "0:p2p:0-1"]
    assert {(m.rank, m.ops.op) for m in pair if len(m.ops)} == {(0, ("send",)), (1, ("recv",))}
    assert {m.node for m in world} == {"node-000", "node-001"}

    diagnosed = run_c4("diagnose", "-", stdin=converted.stdout)
    assert diagnosed.returncode == 0, diagnosed.stderr
    found = [decode(line) for line in diagnosed.stdout.splitlines()]
    hangs = [d for d in found if isinstance(d, Diagnosis) and d.class_ == "noncomm_hang"]
    assert hangs, found
    assert hangs[0].suspects[0].id == "node-001/gpu0"  # global rank 2
    assert hangs[0].evidence["missing_ranks"] == [2]


def test_convert_needs_a_job_and_reports_folders_without_dumps(tmp_path: Path) -> None:
    write_hang_dumps(tmp_path / "dumps")
    result = run_c4("convert", "flight-recorder", str(tmp_path / "dumps"))
    assert result.returncode == 1
    assert b"--job is needed" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_c4("convert", "flight-recorder", str(empty), "--job", "j")
    assert result.returncode == 1
    assert (
        result.stderr.decode().strip().endswith("no dump files (names ending with the rank number)")
    )


class _Exploit:
    """A pickle that would run a command when loaded by a plain unpickler."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_dump_that_loads_a_class_is_rejected_before_anything_runs(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    folder.mkdir()
    marker = tmp_path / "pwned"
    (folder / "trace_0").write_bytes(pickle.dumps({"entries": [_Exploit(marker)]}))
    result = run_c4("convert", "flight-recorder", str(folder), "--job", "j")
    assert result.returncode == 1
    error = result.stderr.decode()
    assert "rejected: the pickle refers to" in error and "system" in error
    assert "only plain data is accepted" in error
    assert not marker.exists()
    with pytest.raises(FlightRecorderError, match="only plain data"):
        load_dump(pickle.dumps({"entries": [], "when": socket.AF_INET}), "x")


def test_garbage_and_wrong_shapes_are_one_line_errors() -> None:
    with pytest.raises(FlightRecorderError, match="not a Flight Recorder pickle"):
        load_dump(b"\x80\x05garbage", "trace_3")
    with pytest.raises(FlightRecorderError, match="no 'entries' list"):
        load_dump(pickle.dumps([1, 2, 3]), "trace_3")


def test_a_bytearray_longer_than_the_pickle_is_refused_before_it_is_allocated() -> None:
    # BYTEARRAY8 claiming 11 GB in a 15-byte pickle (pickle's own loader allocates first).
    claim = b"\x80\x05" + pickle.BYTEARRAY8 + (11_015_619_712).to_bytes(8, "little") + b"abc."
    with pytest.raises(FlightRecorderError, match="11015619712-byte bytearray in a 15-byte"):
        load_dump(claim, "trace_3")
    honest = pickle.dumps({"entries": [bytearray(b"abc")]}, protocol=5)
    assert load_dump(honest, "trace_3") == {"entries": [bytearray(b"abc")]}


@pytest.mark.parametrize(
    ("profiling_name", "expected"),
    [
        ("nccl:all_reduce", "allreduce"),
        ("nccl:_all_gather_base", "allgather"),
        ("nccl:allgather_into_tensor_coalesced", "allgather"),
        ("nccl:_reduce_scatter_base", "reducescatter"),
        ("gloo:reduce", "reduce"),
        ("nccl:all_to_all", "alltoall"),
        ("nccl:send 3->0", "send"),
        ("nccl:recv 0<-3", "recv"),
        ("nccl:gather", None),
    ],
)
def test_profiling_names_map_to_contract_ops(profiling_name: str, expected: str | None) -> None:
    assert op_name(profiling_name)[0] == expected


WORKER = """
import os, sys, torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d
rank = int(sys.argv[1])
dist.init_process_group("gloo", rank=rank, world_size=2)
sub = dist.new_group([0, 1])
t = torch.ones(256)
for _ in range(5):
    dist.all_reduce(t)
    dist.all_gather([torch.empty(256), torch.empty(256)], t, group=sub)
dist.barrier()
c10d._dump_fr_trace_file(rank, backend="gloo")
dist.destroy_process_group()
"""


def test_dumps_written_by_torch_itself_convert_with_aligned_seqs(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCH_FR_BUFFER_SIZE": "1000",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_"),
        "PYTHONWARNINGS": "ignore",
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank)], env=env, cwd=ROOT, stderr=subprocess.PIPE
        )
        for rank in range(2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-2000:]
    dumps = read_folder(tmp_path)
    assert sorted(d.rank for d in dumps) == [0, 1]
    result = convert(dumps, "job-fr")
    ops: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)
    for message in result.messages:
        for seq, op in zip(message.ops.seq, message.ops.op, strict=True):
            ops[(message.comm, message.rank)][seq] = op
    world = {k: v for k, v in ops.items() if k[0] == "0"}
    assert world[("0", 0)] == world[("0", 1)]
    assert list(world[("0", 0)].values()).count("allreduce") == 5
    assert ops[("1", 0)] == ops[("1", 1)] == {seq: "allgather" for seq in range(1, 6)}


def test_the_agent_watches_a_dump_folder_and_converts_each_new_dump_once(tmp_path: Path) -> None:
    from producers.flight_recorder import FlightRecorderSource

    write_hang_dumps(tmp_path / "dumps")
    source = FlightRecorderSource(tmp_path / "dumps", "job-7")
    first = source.read(0)
    assert first.problems == []
    ranks = {m.global_rank for m in first.messages if isinstance(m, Collective)}
    assert ranks == {0, 1, 2, 3}
    assert source.read(0).messages == []  # nothing new
    (tmp_path / "dumps" / "trace_9").write_bytes(b"not a pickle")
    again = source.read(0)
    assert again.messages == [] and len(again.problems) == 1
    assert "trace_9: not a Flight Recorder pickle" in again.problems[0]


def test_nccl_inspector_logs_convert_for_diagnose(tmp_path: Path) -> None:
    import json

    folder = tmp_path / "inspector"
    folder.mkdir()
    for rank in range(4):
        records = []
        for sn in range(1, 31):
            late = 5_000 if rank == 1 else 0  # rank 1 enters last: the shortest execution
            records.append(
                {
                    "header": {"id": "0xabc", "rank": rank, "n_ranks": 4, "nnodes": 1},
                    "metadata": {"dump_timestamp_us": T0 // 1000 + sn * 100_000, "pid": rank},
                    "coll_perf": {
                        "coll": "AllReduce",
                        "coll_sn": sn,
                        "coll_msg_size_bytes": 1 << 20,
                        "coll_exec_time_us": 20_000 - late,
                    },
                }
            )
        (folder / f"rank{rank}.log").write_text("\n".join(json.dumps(r) for r in records))
    (folder / "broken.log").write_text('{"header": {}}\n')
    result = run_c4("convert", "nccl-inspector", str(folder), "--job", "job-n")
    assert result.returncode == 0, result.stderr
    assert b"record skipped: missing or wrong field" in result.stderr
    messages = [decode(line) for line in result.stdout.splitlines()]
    assert len(messages) == 4
    assert all(isinstance(m, Collective) and m.ops.seq == tuple(range(1, 31)) for m in messages)

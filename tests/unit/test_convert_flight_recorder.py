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

from producers.fr_convert import convert
from producers.fr_dump import FlightRecorderError, load_dump
from producers.fr_dump import read_dump_folder as read_folder
from producers.fr_entries import op_name
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


FIXTURES = ROOT / "tests" / "fixtures" / "flight_recorder"
sys.path.insert(0, str(FIXTURES))


def _fixture(tmp_path: Path, name: str) -> Path:
    """A committed set of torch-written dumps, copied with their dump times restored."""
    import json
    import shutil

    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    for file, written in json.loads((folder / "written_ns.json").read_text()).items():
        os.utime(folder / file, ns=(written, written))
    return folder


def _ops_by_side(messages: list[Collective]) -> dict[tuple[str, int], dict[int, tuple[str, bool]]]:
    """(comm, global rank) -> seq -> (op, completed), the latest report winning."""
    sides: dict[tuple[str, int], dict[int, tuple[str, bool]]] = defaultdict(dict)
    for message in sorted(messages, key=lambda m: m.ts_ns):
        for seq, op, end in zip(message.ops.seq, message.ops.op, message.ops.end_ns, strict=True):
            sides[(message.comm, message.global_rank)][seq] = (op, end is not None)
    return sides


def _placement(tmp_path: Path) -> Path:
    places = [RankPlace(rank=r, node=f"node-00{r // 2}", gpu=r % 2) for r in range(4)]
    comms = {"0": (0, 1, 2, 3), "3": (0, 1), "4": (2, 3), "1": (0, 2), "2": (1, 3)}
    job = Job(
        v=1, kind="job", job="job-pp", ts_ns=T0, state="running", ranks=tuple(places), comms=comms
    )
    path = tmp_path / "job.json"
    path.write_bytes(encode(job))
    return path


def _diagnose_names_only_rank_3(tmp_path: Path, folder: Path) -> list[Diagnosis]:
    converted = run_c4(
        "convert", "flight-recorder", str(folder), "--placement", str(_placement(tmp_path))
    )
    assert converted.returncode == 0, converted.stderr
    assert b" 0 skipped" in converted.stderr, converted.stderr
    diagnosed = run_c4("diagnose", "-", stdin=converted.stdout)
    assert diagnosed.returncode == 0, diagnosed.stderr
    found = [decode(line) for line in diagnosed.stdout.splitlines()]
    findings = [d for d in found if isinstance(d, Diagnosis)]
    hangs = [d for d in findings if d.class_ == "noncomm_hang"]
    assert hangs, diagnosed.stdout.decode()
    # Rank 3 (node-001, GPU 1) stopped issuing work; ranks 0, 1, 2 only wait.
    stuck = {"node-001/gpu1", "job-pp/rank3"}
    assert {hang.suspects[0].id for hang in hangs} <= stuck, diagnosed.stdout.decode()
    named = {s.id for d in findings for s in d.suspects}
    assert named <= stuck | {"node-001"}, diagnosed.stdout.decode()
    return hangs


def test_torch_written_dumps_of_a_stuck_pipeline_rank_align_per_pair(tmp_path: Path) -> None:
    result = convert(read_folder(_fixture(tmp_path, "stuck_rank3")), "job-pp")
    assert result.skipped == []
    sides = _ops_by_side(result.messages)
    # Pipeline pairs (groups [0, 2] and [1, 3], peers named by group rank): the pair's own
    # seq, the same operation under the same seq on both sides (a send is the other's recv).
    flip = {"send": "recv", "recv": "send"}
    for low, high in ((0, 2), (1, 3)):
        comm = f"{1 + low}:p2p:{low}-{high}"
        a, b = sides[(comm, low)], sides[(comm, high)]
        assert list(a) == list(range(1, len(a) + 1))
        assert all(b[seq][0] == flip[a[seq][0]] for seq in b if seq in a)
    # Rank 1 sent step 4's activations and waits (the call has not returned): in flight;
    # rank 3 never called the matching recv.
    assert sides[("2:p2p:1-3", 1)][9] == ("send", False)
    assert 9 not in sides[("2:p2p:1-3", 3)]
    assert all(done for done in list(sides[("2:p2p:1-3", 1)].values())[:-1])
    # Pair 0-2 finished every operation: the next call of each thread shows it returned.
    assert all(done for op, done in sides[("1:p2p:0-2", 0)].values())
    # Data-parallel groups (coalesced allreduce of two buckets is one operation) and world.
    assert sides[("3", 0)][5] == ("allreduce", False) and 5 not in sides[("3", 1)]
    assert sides[("4", 2)][5] == ("allreduce", False) and 5 not in sides[("4", 3)]
    bucket_bytes = {nbytes for m in result.messages if m.comm == "3" for nbytes in m.ops.bytes}
    assert bucket_bytes == {(128 + 64) * 4}
    assert {seq for (comm, _), ops in sides.items() if comm == "0" for seq in ops} == {1, 2, 3, 4}


def test_torch_written_dumps_with_wrapped_ring_buffers_align_by_sequence_id(
    tmp_path: Path,
) -> None:
    # TORCH_FR_BUFFER_SIZE=5: every rank kept only its last 5 entries per recorder, ranks
    # kept different windows (the stuck rank issued less).
    result = convert(read_folder(_fixture(tmp_path, "stuck_rank3_wrapped")), "job-pp")
    assert result.skipped == []
    sides = _ops_by_side(result.messages)
    flip = {"send": "recv", "recv": "send"}
    for low, high in ((0, 2), (1, 3)):
        comm = f"{1 + low}:p2p:{low}-{high}"
        a, b = sides[(comm, low)], sides[(comm, high)]
        common = set(a) & set(b)
        assert len(common) >= 4
        assert all(b[seq][0] == flip[a[seq][0]] for seq in common)
    # Rank 1 kept p2p_seq_id 5..9, rank 3 kept 4..8: rank 1's in-flight send (p2p 9) is one
    # past rank 3's last operation, as without the drops. What only one side still holds
    # (rank 3's p2p 4) is left out: both went on past it.
    one, three = sides[("2:p2p:1-3", 1)], sides[("2:p2p:1-3", 3)]
    assert max(one) == max(three) + 1 and one[max(one)] == ("send", False)
    assert min(three) == min(one) and all(three[s][0] != one[s][0] for s in three)
    # Collectives by collective_seq_id: rank 0 kept 3..5 of group 3, rank 1 kept 3..4.
    assert set(sides[("3", 0)]) == {3, 4, 5} and set(sides[("3", 1)]) == {3, 4}


@pytest.mark.parametrize("fixture", ["stuck_rank3", "stuck_rank3_wrapped"])
def test_torch_written_dumps_diagnose_the_stuck_rank_and_no_waiter(
    tmp_path: Path, fixture: str
) -> None:
    _diagnose_names_only_rank_3(tmp_path, _fixture(tmp_path, fixture))


def test_a_real_pipeline_job_with_a_stuck_rank_end_to_end(tmp_path: Path) -> None:
    """Real torch processes (gloo, 2 stages x 2 replicas); rank 3 stops; dumps by torch."""
    from make_dumps import make_dumps

    dumps = make_dumps(tmp_path / "dumps", buffer=8, hang_s=7.5)
    assert len(dumps) == 8
    hangs = _diagnose_names_only_rank_3(tmp_path, tmp_path / "dumps")
    assert hangs[0].evidence["missing_ranks"] == [1]  # rank 1 of its group [2, 3]


def test_a_real_pipeline_job_with_two_stuck_ranks_names_both_and_no_waiter(
    tmp_path: Path,
) -> None:
    """Ranks 1 and 2 stop (one in each pipeline, one in each data-parallel group); ranks 0
    and 3 wait on them through the p2p pairs. Both are named, no healthy rank."""
    from make_dumps import make_dumps

    make_dumps(tmp_path / "dumps", buffer=8, stuck=(1, 2), hang_s=7.5)
    converted = run_c4(
        "convert",
        "flight-recorder",
        str(tmp_path / "dumps"),
        "--placement",
        str(_placement(tmp_path)),
    )
    assert converted.returncode == 0, converted.stderr
    diagnosed = run_c4("diagnose", "-", stdin=converted.stdout)
    assert diagnosed.returncode == 0, diagnosed.stderr
    findings = [d for d in map(decode, diagnosed.stdout.splitlines()) if isinstance(d, Diagnosis)]
    stuck = {"node-000/gpu1", "node-001/gpu0"}  # ranks 1 and 2
    hangs = [d for d in findings if d.class_ == "noncomm_hang" and d.state == "firing"]
    assert {s.id for d in hangs for s in d.suspects} == stuck, diagnosed.stdout.decode()
    named = {s.id for d in findings for s in d.suspects}
    assert named <= stuck | {"node-000", "node-001"}, diagnosed.stdout.decode()


def _nccl(
    record_id: int,
    pg: str,
    name: str,
    created: int,
    *,
    seq: int = 0,
    p2p_seq: int = 0,
    state: str = "completed",
) -> dict[str, Any]:
    """An entry as ProcessGroupNCCL records it (timing on: scheduled, started, completed)."""
    done = state == "completed"
    return {
        "record_id": record_id,
        "pg_id": 0,
        "process_group": (pg, "desc"),
        "collective_seq_id": seq,
        "p2p_seq_id": p2p_seq,
        "op_id": record_id + 1,
        "profiling_name": name,
        "time_created_ns": created,
        "time_discovered_started_ns": created if state != "scheduled" else None,
        "time_discovered_completed_ns": created + MS if done else None,
        "state": state,
        "input_sizes": [[8]],
        "input_dtypes": ["Float"],
        "output_sizes": [[8]],
        "output_dtypes": ["Float"],
        "is_p2p": " " in name or name == "nccl:coalesced" and p2p_seq > 0,
        "retired": done,
    }


def _write(folder: Path, rank: int, entries: list[dict[str, Any]], config: dict[str, Any]) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / f"nccl_trace_rank_{rank}"
    path.write_bytes(pickle.dumps({"version": "2.4", "pg_config": config, "entries": entries}))
    os.utime(path, ns=(T0 + 10**10, T0 + 10**10))


def test_batched_p2p_coalesced_collectives_and_never_started_entries(tmp_path: Path) -> None:
    # Group "pp" = global ranks [5, 2] (group rank 0 is global 5): a batched isend/irecv
    # (one p2p_seq_id, listed in a different order on each side, closed by nccl:coalesced:
    # the members have no state of their own), then a coalesced allreduce in group "dp"
    # (two entries, one collective_seq_id, closed by allreduce_coalesced), then rank 2's
    # next allreduce is scheduled behind a stuck kernel and never started.
    config = {
        "pp": {"name": "pp", "desc": "pp", "ranks": "[5, 2]"},
        "dp": {"name": "dp", "desc": "dp", "ranks": "[2, 5]"},
    }
    folder = tmp_path / "dumps"
    members_only = {"state": "scheduled", "time_discovered_started_ns": None}
    for rank, me, peer in ((5, 0, 1), (2, 1, 0)):
        batch = [
            _nccl(0, "pp", f"nccl:send {me}->{peer}", T0, p2p_seq=1) | members_only,
            _nccl(1, "pp", f"nccl:recv {me}<-{peer}", T0, p2p_seq=1) | members_only,
            _nccl(2, "pp", "nccl:coalesced", T0, p2p_seq=1),
        ]
        if rank == 2:
            batch = [batch[1], batch[0], batch[2]]
        entries = [
            *batch,
            _nccl(3, "dp", "nccl:all_reduce", T0 + 10 * MS, seq=1) | members_only,
            _nccl(4, "dp", "nccl:all_reduce", T0 + 10 * MS, seq=1) | members_only,
            _nccl(5, "dp", "nccl:allreduce_coalesced", T0 + 10 * MS, seq=1),
            _nccl(
                6,
                "dp",
                "nccl:all_reduce",
                T0 + 20 * MS,
                seq=2,
                state="started" if rank == 5 else "scheduled",
            ),
        ]
        _write(folder, rank, entries, config)
    result = convert(read_folder(folder), "j")
    assert result.skipped == [
        f"{folder / 'nccl_trace_rank_2'}: 1 operations scheduled but never started:"
        " reported as not entered"
    ]
    sides = _ops_by_side(result.messages)
    # The pair's seq: the lower global rank's send first on both sides, all completed.
    assert sides[("pp:p2p:2-5", 2)] == {1: ("send", True), 2: ("recv", True)}
    assert sides[("pp:p2p:2-5", 5)] == {1: ("recv", True), 2: ("send", True)}
    assert {m.rank for m in result.messages if m.comm == "pp:p2p:2-5" and m.global_rank == 5} == {1}
    # The coalesced allreduce is one completed operation of 2 x 32 bytes; seq 2 in flight on
    # rank 5 and not entered on rank 2.
    assert sides[("dp", 5)] == {1: ("allreduce", True), 2: ("allreduce", False)}
    assert sides[("dp", 2)] == {1: ("allreduce", True)}
    assert {b for m in result.messages if m.comm == "dp" for b in m.ops.bytes} == {64, 32}


def test_p2p_seq_per_pair_in_a_larger_group_with_dropped_entries(tmp_path: Path) -> None:
    # Group "w" of 3 ranks; rank 1 is a middle pipeline stage: recv from 0, send to 2, each
    # step. p2p_seq_id counts rank 1's operations with both peers. Rank 1's and rank 2's ring
    # buffers dropped their oldest entries (record_id does not start at 0); rank 0's did not.
    folder = tmp_path / "dumps"
    config = {"w": {"name": "w", "desc": "w", "ranks": "[0, 1, 2]"}}
    steps = 6
    for rank in range(3):
        entries = []
        record = 0
        for step in range(steps):
            t = T0 + step * 100 * MS
            names: list[tuple[str, int]] = []
            if rank == 0:
                names = [("nccl:send 0->1", t)]
            elif rank == 1:
                names = [("nccl:recv 1<-0", t + MS), ("nccl:send 1->2", t + 50 * MS)]
            else:
                names = [("nccl:recv 2<-1", t + 51 * MS)]
            for name, created in names:
                record += 1
                entries.append(_nccl(record - 1, "w", name, created, p2p_seq=record))
        keep = {0: 0, 1: 5, 2: 2}[rank]
        _write(folder, rank, entries[keep:], config)
    result = convert(read_folder(folder), "j")
    assert result.skipped == []
    sides = _ops_by_side(result.messages)
    # Pair 0-1: rank 0 holds steps 0..5, rank 1 holds steps 3..5 (its recvs): same seqs.
    assert sides[("w:p2p:0-1", 0)] == {s: ("send", True) for s in range(4, 7)}
    assert sides[("w:p2p:0-1", 1)] == {s: ("recv", True) for s in range(4, 7)}
    # Pair 1-2: both lost entries; aligned by the times of the calls, not by position.
    one, two = sides[("w:p2p:1-2", 1)], sides[("w:p2p:1-2", 2)]
    assert set(one) == set(two) and len(one) == 4  # steps 2..5 on both
    assert all(op == "send" for op, _ in one.values())

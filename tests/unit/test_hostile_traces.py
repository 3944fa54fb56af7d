"""Hostile Flight Recorder dumps and NCCL Inspector files (issue 35, items 2, 3 and 5).

Each bad file or line costs itself only: it is reported in one line naming the file and
why, the others are still converted, and ``c4 convert`` exits 1. The bombs here are sized
so that the unbounded code ran for minutes (or crashed); pytest-timeout fails them then.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from producers.bounded_read import MAX_NESTING, MAX_RECORD_CHARS, JsonObjectFile, split_json
from producers.flight_recorder import FlightRecorderSource
from producers.fr_convert import FULL_TIMELINES_PER_RANK, MAX_INTERVALS, convert
from producers.fr_dump import (
    MAX_CONFIG_RANKS,
    MAX_ENTRIES,
    MAX_GROUPS,
    MAX_SHAPE_DIMS,
    FlightRecorderError,
    RankDump,
    load_dump,
    read_dump_file,
)
from producers.fr_entries import numel_bytes
from producers.nccl_inspector import InspectorSource
from schemas.codec import decode
from schemas.messages import Collective
from tests.unit.test_convert_flight_recorder import write_hang_dumps

T0 = 1_800_000_000_000_000_000
MS = 1_000_000
DEEP_JSON = '{"a":' * 1000 + "1" + "}" * 1000
# 200,000 tuples inside each other as a dict key: hashing the key recursed in C until the
# process died (PROTO 4, {, (), TUPLE1 x n, 1, SETITEM, 'entries': [], SETITEM, STOP).
DEEP_TUPLE_KEY_PICKLE = (
    b"\x80\x04}" + b")" + b"\x85" * 200_000 + b"K\x01s" + b"X\x07\x00\x00\x00entries]s."
)


def run_c4(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_each(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert all(line.strip() for line in stderr.splitlines()), stderr


# --- NCCL Inspector ----------------------------------------------------------------------


def inspector_line(rank: int, sn: int) -> str:
    return json.dumps(
        {
            "header": {"id": "0xabc", "rank": rank, "n_ranks": 2, "nnodes": 1},
            "metadata": {"dump_timestamp_us": T0 // 1000 + sn * 1000, "pid": rank},
            "coll_perf": {
                "coll": "AllReduce",
                "coll_sn": sn,
                "coll_msg_size_bytes": 1 << 20,
                "coll_exec_time_us": 500,
            },
        }
    )


def inspector_folder(folder: Path) -> Path:
    """Two ranks' good logs, three records each."""
    folder.mkdir()
    for rank in range(2):
        lines = [inspector_line(rank, sn) for sn in range(1, 4)]
        (folder / f"rank{rank}.log").write_text("\n".join(lines) + "\n")
    return folder


def converted_seqs(stdout: str) -> dict[int, tuple[int, ...]]:
    messages = [decode(line.encode()) for line in stdout.splitlines()]
    assert all(isinstance(m, Collective) for m in messages)
    return {m.rank: m.ops.seq for m in messages if isinstance(m, Collective)}


def test_a_deep_inspector_file_is_one_line_and_the_other_files_convert(tmp_path: Path) -> None:
    folder = inspector_folder(tmp_path / "inspector")
    (folder / "deep.log").write_text(DEEP_JSON)
    result = run_c4("convert", "nccl-inspector", str(folder), "--job", "job-d")
    assert result.returncode == 1, result.stderr
    assert_one_line_each(result.stderr)
    assert f"error: {folder / 'deep.log'}: line 1: nested deeper than {MAX_NESTING} levels" in (
        result.stderr.splitlines()
    )
    assert converted_seqs(result.stdout) == {0: (1, 2, 3), 1: (1, 2, 3)}


def test_binary_inspector_files_are_reported_once_and_the_rest_converts(tmp_path: Path) -> None:
    folder = inspector_folder(tmp_path / "inspector")
    # A record, then a pickle's bytes: what comes before the NUL is still read.
    record, pickled = inspector_line(0, 4).encode() + b"\n", pickle.dumps({"entries": []})
    (folder / "rank2.log").write_bytes(record + pickled)
    (folder / "zeros.log").write_bytes(bytes(1 << 20))
    result = run_c4("convert", "nccl-inspector", str(folder), "--job", "job-b")
    assert result.returncode == 1, result.stderr
    assert_one_line_each(result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {folder / 'rank2.log'}: binary data (a NUL byte at byte"
        f" {len(record) + pickled.index(0)}), not JSON: the rest of the file is skipped",
        f"error: {folder / 'zeros.log'}: binary data (a NUL byte at byte 0), not JSON:"
        " the rest of the file is skipped",
    ]
    assert converted_seqs(result.stdout) == {0: (1, 2, 3, 4), 1: (1, 2, 3)}


def test_a_folder_with_nothing_to_convert_is_an_error_line(tmp_path: Path) -> None:
    folder = tmp_path / "inspector"
    folder.mkdir()
    (folder / "deep.log").write_text(DEEP_JSON + "\n")
    result = run_c4("convert", "nccl-inspector", str(folder), "--job", "job-n")
    assert result.returncode == 1
    assert_one_line_each(result.stderr)
    assert result.stderr.splitlines()[-1] == (
        f"c4: error: {folder}: no NCCL Inspector record could be converted from 1 files"
    )


def test_the_agent_reads_past_deep_long_and_binary_inspector_input(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    long_line = '{"pad": "' + "x" * (MAX_RECORD_CHARS + 10) + '"}'
    log.write_text("\n".join([DEEP_JSON, long_line, inspector_line(0, 1), ""]))
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(100))
    source = InspectorSource(tmp_path, "job-a")
    reading = source.read(T0)
    assert {(m.rank, m.ops.seq) for m in reading.messages if isinstance(m, Collective)} == {
        (0, (1,))
    }
    assert reading.problems == [
        f"{tmp_path / 'blob.bin'}: binary data (a NUL byte at byte 7), not JSON:"
        " the rest of the file is skipped",
        f"{log}: line 1: nested deeper than {MAX_NESTING} levels",
        f"{log}: line 2: a record of {len(long_line)} characters (at most {MAX_RECORD_CHARS})",
    ]
    with log.open("a") as out:
        out.write(inspector_line(0, 2) + "\n")
    reading = source.read(T0 + 1)
    assert reading.problems == []  # the binary file is not reported again
    assert [m.ops.seq for m in reading.messages if isinstance(m, Collective)] == [(2,)]


def test_a_huge_line_is_skipped_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    with log.open("w") as out:
        out.write('{"pad": "')
        for _ in range(64):
            out.write("x" * (1 << 20))
        out.write('"}\n' + inspector_line(0, 7) + "\n")
    stream = JsonObjectFile(log)
    tracemalloc.start()
    try:
        objects, problems = stream.read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [obj["coll_perf"]["coll_sn"] for obj in objects] == [7]
    assert problems == [
        f"{log}: line 1: a record over {MAX_RECORD_CHARS} characters,"
        " skipped to the end of its line"
    ]
    assert peak < 24 * MAX_RECORD_CHARS  # a few records' worth, not the 64 MiB line


def test_bad_lines_are_reported_with_their_line_and_the_good_ones_read() -> None:
    text = "\n".join(["{garbage", DEEP_JSON, "[" * 40_000, '{"ok": 1}', "x" * 10, '{"ok": 2}'])
    objects, used, errors = split_json(text + "\n")
    assert objects == [{"ok": 1}, {"ok": 2}] and used == len(text) + 1
    lines = [(text.count("\n", 0, pos) + 1, reason) for pos, reason in errors]
    assert lines == [
        (1, "invalid JSON (Expecting property name enclosed in double quotes)"),
        (2, f"nested deeper than {MAX_NESTING} levels"),
        (3, f"nested deeper than {MAX_NESTING} levels"),
        (5, "invalid JSON (Expecting value)"),
    ]
    # Not final: a deep line still being written waits for its end, as a cut-off record does.
    assert split_json('{"ok": 1}\n' + "[" * 40, final=False)[:2] == ([{"ok": 1}], 10)


# --- Flight Recorder ---------------------------------------------------------------------


def shape_bomb(references: int) -> bytes:
    """The issue's size bomb: one 20,000-dimension shape of 2**62, referred to many times
    (the pickle's memo writes the shape once: 2,000 references fit in 208 KB)."""
    shape = [2**62] * 20_000
    entry = {
        "process_group": ("0", "default_pg"),
        "collective_seq_id": 1,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": T0,
        "time_discovered_completed_ns": T0 + MS,
        "state": "completed",
        "input_sizes": [shape] * references,
        "input_dtypes": ["Float"] * references,
    }
    return pickle.dumps({"pg_config": {}, "entries": [entry]})


@pytest.mark.timeout(60)
def test_the_size_bomb_is_rejected_and_the_other_ranks_convert(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    write_hang_dumps(folder)
    bomb = folder / "nccl_trace_rank_3"
    bomb.write_bytes(shape_bomb(2_000))
    result = run_c4("convert", "flight-recorder", str(folder), "--job", "job-7")
    assert result.returncode == 1, result.stderr
    assert_one_line_each(result.stderr)
    assert (
        f"error: {bomb}: rejected: the entries' tensor shapes have over {MAX_SHAPE_DIMS}"
        " dimensions in all"
    ) in result.stderr.splitlines()
    messages = [decode(line.encode()) for line in result.stdout.splitlines()]
    assert {m.global_rank for m in messages if isinstance(m, Collective)} == {0, 1, 2}
    assert result.stderr.splitlines()[-1].endswith(", 1 unreadable")


@pytest.mark.timeout(60)
def test_a_shape_of_thousands_of_dimensions_costs_its_entry_only() -> None:
    # 200 references (4 million dimensions) pass the dump's bounds; each entry's are checked
    # before anything is multiplied (multiplying first took about 2 s per reference).
    dump = load_dump(shape_bomb(200), "bomb")
    good = {
        **dump["entries"][0],
        "collective_seq_id": 2,
        "input_sizes": [[1024, 1024]],
        "input_dtypes": ["BFloat16"],
    }
    dump["entries"].append(good)
    conversion = convert([RankDump(0, T0 + 2 * MS, dump, "bomb")], "job-1")
    assert conversion.skipped == ["bomb entry 0: a tensor shape of 20000 dimensions (at most 64)"]
    sizes = {
        seq: nbytes
        for m in conversion.messages
        for seq, nbytes in zip(m.ops.seq, m.ops.bytes, strict=True)
    }
    assert sizes == {2: 2 << 20}


def test_sizes_are_multiplied_in_bounds() -> None:
    assert numel_bytes([[2, 3], [4]], ["Double", "Half"]) == 2 * 3 * 8 + 4 * 2
    # A dimension that is not a count makes its tensor empty; a shape that is not a list is
    # a scalar's (one float), as before.
    assert numel_bytes([[5, -1], "x", [3, "y"]], []) == 4
    with pytest.raises(ValueError, match="a tensor size beyond 64 bits"):
        numel_bytes([[2**62] * 64], ["Float"])
    with pytest.raises(ValueError, match="a tensor dimension beyond 64 bits"):
        numel_bytes([[0, 2**64]], ["Float"])
    with pytest.raises(ValueError, match="a size beyond 64 bits"):
        numel_bytes([[2**61]] * 3, ["Float"] * 3)


def entry(seq: int) -> dict[str, Any]:
    return {
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": T0 + seq * MS,
        "time_discovered_completed_ns": T0 + seq * MS + 10,
        "state": "completed",
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
    }


@pytest.mark.parametrize(
    ("dump", "reason"),
    [
        ({"entries": [entry(1)] * (MAX_ENTRIES + 1)}, f"{MAX_ENTRIES + 1} entries"),
        (
            {"pg_config": {str(g): {} for g in range(MAX_GROUPS + 1)}, "entries": []},
            f"{MAX_GROUPS + 1} process groups in pg_config",
        ),
        (
            {
                "pg_config": {str(g): {"ranks": "[0, 1]" * 1000} for g in range(9000)},
                "entries": [],
            },
            f"pg_config lists over {MAX_CONFIG_RANKS} ranks",
        ),
        (
            {"entries": [{**entry(1), "input_sizes": [[1]] * 5000}] * 500},
            "the entries hold over 2097152 tensor shapes in all",
        ),
    ],
    ids=["entries", "groups", "config-ranks", "shapes"],
)
def test_counts_in_a_dump_are_bounded(dump: dict[str, Any], reason: str) -> None:
    with pytest.raises(FlightRecorderError, match=f"^rank7: rejected: {reason}"):
        load_dump(pickle.dumps(dump), "rank7")


def test_one_unreadable_dump_among_good_ones(tmp_path: Path) -> None:
    folder = tmp_path / "dumps"
    write_hang_dumps(folder)
    bad = folder / "nccl_trace_rank_1"
    bad.write_bytes(b"\x80\x04h\xbb.")  # a memo reference to nothing
    deep = folder / "nccl_trace_rank_3"
    deep.write_bytes(DEEP_TUPLE_KEY_PICKLE)
    result = run_c4("convert", "flight-recorder", str(folder), "--job", "job-7")
    assert result.returncode == 1, result.stderr
    assert_one_line_each(result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {bad}: not a Flight Recorder pickle (UnpicklingError: Memo value not found"
        " at index 187)",
        f"error: {deep}: rejected: the pickle has tuples nested deeper than 32 levels",
    ]
    messages = [decode(line.encode()) for line in result.stdout.splitlines()]
    assert {m.global_rank for m in messages if isinstance(m, Collective)} == {0, 2}

    for path in sorted(folder.iterdir()):
        if path not in (bad, deep):
            path.unlink()
    result = run_c4("convert", "flight-recorder", str(folder), "--job", "job-7")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        f"c4: error: {folder}: none of its 2 dump files could be read"
    )


@pytest.mark.timeout(60)
def test_the_agent_reports_a_bomb_once_and_converts_the_other_dumps(tmp_path: Path) -> None:
    write_hang_dumps(tmp_path / "dumps")
    (tmp_path / "dumps" / "nccl_trace_rank_2").write_bytes(shape_bomb(2_000))
    source = FlightRecorderSource(tmp_path / "dumps", "job-1")
    reading = source.read(T0)
    assert {m.global_rank for m in reading.messages if isinstance(m, Collective)} == {0, 1, 3}
    assert [p for p in reading.problems if "nccl_trace_rank_2" in p] == [
        f"{tmp_path / 'dumps' / 'nccl_trace_rank_2'}: rejected: the entries' tensor shapes"
        f" have over {MAX_SHAPE_DIMS} dimensions in all"
    ]
    assert source.read(T0 + 1).problems == []  # reported once


def test_the_read_of_an_oversized_dump_stops_at_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("producers.fr_dump.MAX_DUMP_BYTES", 1_000)
    path = tmp_path / "trace_0"
    path.write_bytes(pickle.dumps({"entries": [entry(s) for s in range(100)]}))
    with pytest.raises(FlightRecorderError, match=r"trace_0: over 1000 bytes, more than a dump"):
        read_dump_file(path)


@pytest.mark.timeout(120)
def test_a_dump_of_many_collectives_converts_in_linear_time() -> None:
    # The end of each group's timeline was found again for each of its operations, and
    # every operation in flight scanned once per interval: both quadratic.
    done = [entry(seq) for seq in range(1, 60_001)]
    in_flight = [
        {**entry(seq), "time_discovered_completed_ns": None, "state": "started"}
        for seq in range(60_001, 90_001)
    ]
    dump = load_dump(pickle.dumps({"entries": done + in_flight}), "rank0")
    conversion = convert([RankDump(0, T0 + 100 * 10**9, dump, "rank0")], "job-1")
    seqs = [seq for m in conversion.messages for seq in m.ops.seq]
    assert sorted(set(seqs)) == list(range(1, 90_001))
    assert conversion.skipped == []


def test_a_rank_naming_a_peer_per_entry_gets_bounded_heartbeats() -> None:
    peers = 200
    sends = [
        {
            "process_group": ("0", "default_pg"),
            "p2p_seq_id": peer,
            "profiling_name": f"nccl:send 0->{peer}",
            "is_p2p": True,
            "time_created_ns": T0,
            "time_discovered_completed_ns": T0 + 10,
            "state": "completed",
        }
        for peer in range(1, peers + 1)
    ]
    ranks = "[" + ", ".join(str(rank) for rank in range(peers + 1)) + "]"
    dump = {"pg_config": {"0": {"name": "0", "ranks": ranks}}, "entries": sends}
    hour_later = T0 + 3_600 * 10**9
    conversion = convert([RankDump(0, hour_later, load_dump(pickle.dumps(dump), "r0"), "r0")], "j")
    share = MAX_INTERVALS * FULL_TIMELINES_PER_RANK // peers
    assert conversion.skipped == [
        f"rank 0: {peers} communicators: heartbeats for the last {share} intervals only"
        " (older operations in their first message)"
    ]
    assert len(conversion.messages) <= peers * (share + 1)
    sent = {m.comm for m in conversion.messages if m.ops.op == ("send",)}
    assert sent == {f"0:p2p:0-{peer}" for peer in range(1, peers + 1)}


def test_names_are_taken_from_scalars_only() -> None:
    # The text of a list 100,000 deep recursed; of a long one, cost its length per entry.
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    hostile = {**entry(2), "process_group": (nested, "x"), "thread_id": [0] * 10}
    dump = {"entries": [hostile, {**entry(3), "profiling_name": "nccl:" + "x" * 10_000}, entry(1)]}
    conversion = convert([RankDump(0, T0 + 10 * MS, dump, "d0")], "job-1")
    assert conversion.skipped == [
        "d0 entry 0: malformed (TypeError: list where a name was expected)",
        "d0 entry 1: malformed (ValueError: a profiling name of 10005 characters)",
    ]
    assert {seq for m in conversion.messages for seq in m.ops.seq} == {1}

"""Fuzzing the node agent's readers: Flight Recorder dumps, NCCL Inspector output, sysfs files.

Each reader gets hostile input (wrong types, huge and negative numbers, NaN/inf, odd unicode,
truncated and garbled bytes) and must: never raise anything but its own one-line error, say
what it skipped in one line each, and produce only messages that are valid v1 wire (they
encode and decode back to themselves), with the good records around bad ones still read.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.flight_recorder import FlightRecorderSource
from producers.fr_convert import convert
from producers.fr_dump import FlightRecorderError, RankDump, load_dump
from producers.nccl_inspector import InspectorSource, parse_record, split_objects, to_messages
from producers.sysfs import SysfsSource
from schemas.base import C4Model
from schemas.codec import decode, encode
from tests.hostile import EDGE_NUMBERS, ODD_TEXT, SCALARS, VALUES, damaged

T0 = 1_800_000_000_000_000_000
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_valid_wire(message: C4Model) -> None:
    """A produced message is v1 wire: it encodes, and decodes back to itself."""
    back = decode(encode(message))
    assert back == message, back


def assert_one_line(lines: list[str]) -> None:
    for line in lines:
        assert line and "\n" not in line, line


# --- Flight Recorder ---------------------------------------------------------------------

GOOD_NAMES = ["nccl:all_reduce", "nccl:_all_gather_base", "nccl:broadcast", "nccl:send 0->1"]


def good_entry(seq: int) -> dict[str, Any]:
    return {
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": T0 + seq * 1_000_000,
        "time_discovered_completed_ns": T0 + seq * 1_000_000 + 500_000,
        "state": "completed",
        "input_sizes": [[1024]],
        "input_dtypes": ["Float"],
    }


@st.composite
def hostile_entries(draw: st.DrawFn) -> Any:
    """An entry that is wrong somewhere: a field replaced, removed or of another type."""
    if draw(st.integers(0, 9)) == 0:
        return draw(VALUES)
    entry: dict[str, Any] = good_entry(draw(st.integers(1, 50)))
    for _ in range(draw(st.integers(1, 3))):
        field = draw(
            st.sampled_from(
                [
                    *entry,
                    "retired",
                    "is_p2p",
                    "process_group",
                ]
            )
        )
        if draw(st.booleans()):
            entry.pop(field, None)
            continue
        entry[field] = draw(
            st.one_of(
                SCALARS,
                EDGE_NUMBERS,
                st.sampled_from(GOOD_NAMES + ["nccl:send 3->?", "gloo:recv 1<-9", "x" * 10_000]),
                st.tuples(ODD_TEXT, ODD_TEXT),
                st.lists(st.lists(EDGE_NUMBERS, max_size=4), max_size=3),
            )
        )
    return entry


@st.composite
def dumps(draw: st.DrawFn) -> dict[str, Any]:
    """A dump whose good entries (seq 1..n) surround hostile ones, with a hostile config."""
    good = [good_entry(seq) for seq in range(1, draw(st.integers(0, 6)) + 1)]
    bad = draw(st.lists(hostile_entries(), max_size=6))
    entries: list[Any] = list(good)
    for item in bad:
        entries.insert(draw(st.integers(0, len(entries))), item)
    ranks = draw(
        st.one_of(
            st.just("[0, 1]"),
            st.sampled_from(["[1e999]", "[-1]", "[[[[", "(0, 1)", "'x'", "[0, 1] + 1", ""]),
            st.lists(EDGE_NUMBERS, max_size=4),
            SCALARS,
        )
    )
    dump: dict[str, Any] = {
        "version": draw(st.one_of(st.just("2.5"), SCALARS)),
        "pg_config": draw(
            st.one_of(
                st.just({"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}),
                VALUES,
            )
        ),
        "pg_status": draw(
            st.one_of(st.just({"0": {"last_completed_collective": draw(SCALARS)}}), VALUES)
        ),
        "entries": entries,
    }
    return dump


@FUZZ
@given(dumps(), st.sampled_from([0, 1]), st.sampled_from([T0 + 10**10, T0 - 10**15, 0]))
def test_flight_recorder_conversion_of_hostile_dumps(
    dump: dict[str, Any], rank: int, written_ns: int
) -> None:
    loaded = load_dump(pickle.dumps(dump), "dump1")
    conversion = convert([RankDump(rank, written_ns, loaded, "dump1")], "job-1")
    assert_one_line(conversion.skipped)
    for message in conversion.messages:
        assert_valid_wire(message)
    # The good entries (seq 1..) of the default group survive whatever surrounds them.
    good = {
        entry["collective_seq_id"]
        for entry in dump["entries"]
        if entry in [good_entry(s) for s in range(1, 7)]
    }
    seen = {seq for message in conversion.messages for seq in message.ops.seq}
    assert good <= seen


@FUZZ
@given(st.data())
def test_flight_recorder_loader_takes_only_plain_pickles(data: st.DataObject) -> None:
    good = pickle.dumps({"entries": [good_entry(1)], "pg_config": {}})
    raw = data.draw(st.one_of(st.binary(max_size=300), damaged(good)))
    try:
        dump = load_dump(raw, "rank0")
    except FlightRecorderError as error:
        assert str(error).startswith("rank0: ") and "\n" not in str(error)
        return
    assert isinstance(dump, dict) and isinstance(dump["entries"], list)
    convert([RankDump(0, T0, dump, "rank0")], "job-1")


def test_flight_recorder_source_goes_on_past_a_bad_file(tmp_path: Path) -> None:
    (tmp_path / "dump0").write_bytes(pickle.dumps({"entries": [good_entry(1)]}))
    (tmp_path / "dump1").write_bytes(b"\x80\x04not a pickle")
    (tmp_path / "dump2").write_bytes(pickle.dumps({"entries": [{"time_created_ns": -1}]}))
    reading = FlightRecorderSource(tmp_path, "job-1").read(T0)
    assert [m.global_rank for m in reading.messages] and all(
        m.global_rank == 0 for m in reading.messages
    )
    assert any("dump1" in problem for problem in reading.problems)
    assert any("dump2" in problem for problem in reading.problems)
    assert_one_line(reading.problems)


# --- NCCL Inspector ----------------------------------------------------------------------


def inspector_record(seq: int) -> dict[str, Any]:
    return {
        "header": {"id": "0xabc", "rank": 1, "n_ranks": 4, "nnodes": 1},
        "metadata": {"hostname": "n1", "pid": 7, "dump_timestamp_us": T0 // 1000 + seq},
        "coll_perf": {
            "coll": "AllReduce",
            "coll_sn": seq,
            "coll_msg_size_bytes": 4096,
            "coll_exec_time_us": 61.5,
            "coll_timing_source": "kernel_gpu",
        },
    }


@st.composite
def hostile_records(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 5)) == 0:
        return draw(VALUES)
    record = inspector_record(draw(st.integers(0, 99)))
    part = draw(st.sampled_from(["header", "metadata", "coll_perf"]))
    section = dict(record[part])
    field = draw(st.sampled_from([*section, "event_trace_ts"]))
    section[field] = draw(
        st.one_of(
            VALUES,
            st.just({"coll_start_ts": 10**20, "kernel_events": [{"kernel_stop_ts": -1}]}),
            st.just({"coll_start_ts": 5, "kernel_events": "x"}),
        )
    )
    record[part] = section
    return record


@FUZZ
@given(st.lists(st.one_of(st.builds(inspector_record, st.integers(0, 99)), hostile_records())))
def test_inspector_records_parse_or_say_why(records: list[Any]) -> None:
    ops = []
    for record in records:
        try:
            ops.append(parse_record(record))
        except ValueError as error:
            assert str(error) and "\n" not in str(error)
    for message in to_messages(ops, "job-1", T0):
        assert_valid_wire(message)


@FUZZ
@given(st.lists(st.one_of(st.builds(inspector_record, st.integers(0, 99)), hostile_records())))
def test_inspector_source_reads_good_lines_between_bad_ones(
    tmp_path_factory: Any, records: list[Any]
) -> None:
    folder = tmp_path_factory.mktemp("inspector")
    lines = [json.dumps(record, allow_nan=True) for record in records]
    lines.insert(0, json.dumps(inspector_record(1000)))
    lines.append("{garbage")
    lines.append(json.dumps(inspector_record(1001)))
    (folder / "rank1.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    reading = InspectorSource(folder, "job-1").read(T0)
    assert_one_line(reading.problems)
    for message in reading.messages:
        assert_valid_wire(message)
    seqs = {seq for message in reading.messages for seq in message.ops.seq}
    assert {1000, 1001} <= seqs


@FUZZ
@given(st.one_of(ODD_TEXT, st.binary(max_size=400).map(lambda b: b.decode("utf-8", "replace"))))
def test_split_objects_never_raises(text: str) -> None:
    objects, used, errors = split_objects(text)
    assert 0 <= used <= len(text)
    assert_one_line(errors)


@FUZZ
@given(st.data())
def test_inspector_source_survives_truncated_and_garbled_files(
    tmp_path_factory: Any, data: st.DataObject
) -> None:
    folder = tmp_path_factory.mktemp("inspector")
    good = ("\n".join(json.dumps(inspector_record(s)) for s in range(3)) + "\n").encode()
    (folder / "a.log").write_bytes(data.draw(damaged(good)))
    (folder / "b.log").write_bytes(data.draw(st.binary(max_size=300)))
    source = InspectorSource(folder, "job-1")
    for round_ns in (T0, T0 + 10**9):
        reading = source.read(round_ns)
        assert_one_line(reading.problems)
        for message in reading.messages:
            assert_valid_wire(message)


# --- sysfs -------------------------------------------------------------------------------

COUNTER_TEXT = st.one_of(
    st.integers(0, 2**64).map(str),
    st.sampled_from(["", "\n", "-1", "1e9", "²", "١٢٣", "0x10", " 7 ", "99" * 40, "NaN"]),
    ODD_TEXT,
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
STATE_TEXT = st.one_of(st.sampled_from(["4: ACTIVE", "1: DOWN", "up", "down", ""]), ODD_TEXT)
RATE_TEXT = st.one_of(
    st.sampled_from(
        ["200 Gb/sec (2X NDR)", "1e400 Gb/sec", "99999999999999999999 Gb/sec", "-5 Gb/sec"]
    ),
    st.integers(-(2**70), 2**70).map(str),
    ODD_TEXT,
)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["port_xmit_data", "port_rcv_data", "symbol_error", "link_downed"]),
        COUNTER_TEXT,
    ),
    st.dictionaries(st.sampled_from(["tx_bytes", "rx_bytes", "rx_errors"]), COUNTER_TEXT),
    STATE_TEXT,
    RATE_TEXT,
    st.one_of(st.sampled_from(["up", "down"]), ODD_TEXT),
    st.one_of(st.sampled_from(["100000", "-1"]), RATE_TEXT),
)
def test_sysfs_files_with_any_content(
    tmp_path_factory: Any,
    ib: dict[str, str],
    net: dict[str, str],
    state: str,
    rate: str,
    operstate: str,
    speed: str,
) -> None:
    root = tmp_path_factory.mktemp("sys")
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    for name, text in ib.items():
        (port / "counters" / name).write_text(text, encoding="utf-8", errors="surrogateescape")
    (port / "state").write_text(state, encoding="utf-8", errors="surrogateescape")
    (port / "rate").write_text(rate, encoding="utf-8", errors="surrogateescape")
    # A good port beside the bad one: still read in full.
    good = root / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    (good / "counters").mkdir(parents=True)
    (good / "counters" / "port_xmit_data").write_text("10\n")
    (good / "counters" / "port_rcv_data").write_text("20\n")
    (good / "state").write_text("4: ACTIVE\n")
    (good / "rate").write_text("400 Gb/sec (4X NDR)\n")
    interface = root / "class" / "net" / "eth0"
    (interface / "statistics").mkdir(parents=True)
    (interface / "device").mkdir()
    for name, text in net.items():
        (interface / "statistics" / name).write_text(
            text, encoding="utf-8", errors="surrogateescape"
        )
    (interface / "operstate").write_text(operstate, encoding="utf-8", errors="surrogateescape")
    (interface / "speed").write_text(speed, encoding="utf-8", errors="surrogateescape")
    reading = SysfsSource("node-1", root).read(T0)
    assert_one_line(reading.problems)
    for message in reading.messages:
        assert_valid_wire(message)
    by_port = {message.port: message for message in reading.messages}
    assert by_port["mlx5_1:1"].counters.tx_bytes == 40
    assert by_port["mlx5_1:1"].gbps == 400.0


def test_a_boolean_time_costs_its_entry_only() -> None:
    # Found by the fuzz test: int(False) is 0, so a boolean time passed as a time and then
    # failed the whole process group's conversion.
    hostile = {**good_entry(2), "time_created_ns": False, "time_discovered_completed_ns": False}
    dump = {
        "version": "2.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_completed_collective": None}},
        "entries": [hostile, good_entry(1)],
    }
    loaded = load_dump(pickle.dumps(dump), "dump1")
    conversion = convert([RankDump(0, T0 + 10**10, loaded, "dump1")], "job-1")
    assert [line.split(": ", 1)[1] for line in conversion.skipped] == [
        "malformed (TypeError: time_created_ns is a boolean)"
    ]
    assert {seq for message in conversion.messages for seq in message.ops.seq} == {1}

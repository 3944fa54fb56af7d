"""NCCL Inspector tailing, the torch folder handoff, the op recorder and the agent's schedule."""

from __future__ import annotations

import json
from pathlib import Path

from producers.agent import Agent
from producers.handoff import FolderSink, HandoffSource
from producers.nccl_inspector import InspectorSource, parse_record, split_objects
from producers.oplog import END, OpRecorder
from producers.sources import Reading
from schemas.base import C4Model
from schemas.messages import Collective, Ops

US = 1_000
T0 = 1_800_000_000_000_000_000


def inspector_record(rank: int, sn: int, exec_us: int, dump_us: int, verbose: bool = False) -> dict:
    perf: dict = {
        "coll": "AllReduce",
        "coll_sn": sn,
        "coll_msg_size_bytes": 1 << 20,
        "coll_exec_time_us": exec_us,
        "coll_algobw_gbs": 1.0,
        "coll_busbw_gbs": 1.5,
    }
    if verbose:
        perf["event_trace_ts"] = {
            "coll_start_ts": dump_us - 500,
            "coll_stop_ts": dump_us - 499,
            "kernel_events": [
                {"channel_id": 0, "kernel_start_ts": dump_us - 400, "kernel_stop_ts": dump_us - 100}
            ],
        }
    return {
        "header": {"id": "0x7f8c496ae9f661", "rank": rank, "n_ranks": 4, "nnodes": 1},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "dump_timestamp_us": dump_us,
            "hostname": "h",
            "pid": 1,
        },
        "coll_perf": perf,
    }


def test_inspector_records_become_ops_with_their_durations() -> None:
    dump_us = T0 // US
    op = parse_record(inspector_record(2, 1407, 61_974, dump_us))
    assert (op.comm, op.comm_size, op.rank, op.seq, op.op) == (
        "0x7f8c496ae9f661",
        4,
        2,
        1407,
        "allreduce",
    )
    assert op.end_ns == T0 and op.end_ns - op.enter_ns == 61_974 * US
    verbose = parse_record(inspector_record(2, 1408, 300, dump_us, verbose=True))
    assert verbose.enter_ns == (dump_us - 500) * US and verbose.end_ns == (dump_us - 100) * US


def test_inspector_source_tails_pretty_and_line_files_and_reports_bad_records(
    tmp_path: Path,
) -> None:
    pretty = tmp_path / "rank2.log"
    lines = tmp_path / "sub" / "rank3.log"
    lines.parent.mkdir()
    dump_us = T0 // US
    pretty.write_text(json.dumps(inspector_record(2, 1, 100, dump_us), indent=2) + "\n")
    complete = json.dumps(inspector_record(3, 1, 90, dump_us))
    lines.write_text(complete + "\n" + complete[:40])  # the second record is being written
    source = InspectorSource(tmp_path, "job-3", node="node-002")
    reading = source.read(T0 + 5)
    assert reading.problems == []
    by_rank = {m.rank: m for m in reading.messages if isinstance(m, Collective)}
    assert by_rank[2].ops.seq == (1,) and by_rank[3].ops.seq == (1,)
    assert by_rank[2].node == "node-002" and by_rank[2].job == "job-3"

    with lines.open("a") as out:
        out.write(json.dumps(inspector_record(3, 2, 80, dump_us))[40:] + "\n")
        out.write("{not json}\n")
        broken = inspector_record(3, 3, 80, dump_us)
        del broken["coll_perf"]["coll_sn"]
        out.write(json.dumps(broken) + "\n")
    reading = source.read(T0 + 10)
    by_rank = {m.rank: m for m in reading.messages if isinstance(m, Collective)}
    assert by_rank[3].ops.seq == (2,)  # the record completed by the append
    assert by_rank[2].ops.seq == ()  # nothing new from rank 2: a heartbeat
    assert len(reading.problems) == 2
    assert "invalid JSON" in reading.problems[0]
    assert "record skipped: missing or wrong field" in reading.problems[1]


def test_split_objects_waits_for_a_cut_off_object() -> None:
    objects, used, errors = split_objects('{"a": 1}\n{"b": ')
    assert objects == [{"a": 1}] and used == len('{"a": 1}\n') and errors == []


def test_op_recorder_reports_in_flight_ops_again_when_they_finish() -> None:
    recorder = OpRecorder("job-1", node="node-000", gpu=3)
    world = recorder.comm("0", 4, 1, 1)
    first = world.enter("allreduce", 1024, T0)
    second = world.enter("allgather", 2048, T0 + 10)
    first[END] = T0 + 50
    (message,) = recorder.messages(T0 + 100)
    assert message.ops.seq == (0, 1)
    assert message.ops.end_ns == (T0 + 50, None)
    assert (message.node, message.gpu, message.rank, message.comm_size) == ("node-000", 3, 1, 4)

    (heartbeat,) = recorder.messages(T0 + 200)
    assert heartbeat.ops.seq == ()  # still in flight: not reported again until it finishes
    second[END] = T0 + 5  # a wall clock stepped back: end is never before enter
    (message,) = recorder.messages(T0 + 300)
    assert message.ops.seq == (1,) and message.ops.end_ns == (T0 + 10,)
    assert recorder.messages(T0 + 400)[0].ops.seq == ()


def test_folder_handoff_carries_messages_to_the_agent(tmp_path: Path) -> None:
    recorder = OpRecorder("job-1")
    recorder.comm("0", 2, 0, 0).enter("barrier", 0, T0)[END] = T0 + 1
    sink = FolderSink(tmp_path, "job-1.rank0")
    sink(recorder.messages(T0 + 10))
    with sink.path.open("ab") as out:
        out.write(b'{"v": 1, "kind": "collective", "rank": -1}\n{"v": 1, "ki')
    source = HandoffSource(tmp_path)
    reading = source.read(0)
    assert [m.ops.op for m in reading.messages if isinstance(m, Collective)] == [("barrier",)]
    assert len(reading.problems) == 1 and "job-1.rank0.000001.jsonl byte" in reading.problems[0]
    sink(recorder.messages(T0 + 20))
    sink.close()
    assert source.read(0).messages == []  # the cut-off line is still incomplete


def test_handoff_files_rotate_and_read_ones_are_deleted(tmp_path: Path) -> None:
    recorder = OpRecorder("job-1")
    log = recorder.comm("0", 2, 0, 0)
    sink = FolderSink(tmp_path, "rank[0]", max_bytes=600)
    source = HandoffSource(tmp_path)
    seen: list[int] = []
    for step in range(12):
        log.enter("allreduce", 8, T0 + step)[END] = T0 + step + 1
        sink(recorder.messages(T0 + step + 2))
        seen += [s for m in source.read(0).messages if isinstance(m, Collective) for s in m.ops.seq]
    sink.close()
    assert seen == list(range(12))  # every op once, in order, across the rotations
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1 and files[0].startswith("rank[0].")  # read files were deleted
    assert FolderSink(tmp_path, "rank[0]").path.name > files[0]  # a restart starts a new file


def _seqs(reading: Reading) -> list[int]:
    return [s for m in reading.messages if isinstance(m, Collective) for s in m.ops.seq]


class _Trainer:
    """One training rank handing its finished allreduces to the agent's folder."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.recorder = OpRecorder("job-1")
        self.log = self.recorder.comm("0", 2, 0, 0)
        self.sink = FolderSink(folder, "rank0", max_bytes=max_bytes)

    def run(self, steps: range) -> None:
        for step in steps:
            self.log.enter("allreduce", 8, T0 + step)[END] = T0 + step + 1
            self.sink(self.recorder.messages(T0 + step + 2))


def test_a_restart_goes_on_from_the_last_commit_not_from_the_last_read(tmp_path: Path) -> None:
    folder, checkpoint = tmp_path / "handoff", tmp_path / "offsets.json"
    trainer = _Trainer(folder, max_bytes=500)
    source = HandoffSource(folder, checkpoint=checkpoint)
    trainer.run(range(6))
    first = _seqs(source.read(0))
    assert first == list(range(6))
    assert source.commit() is None
    trainer.run(range(6, 9))
    assert _seqs(source.read(0)) == [6, 7, 8]  # read, never committed: the agent was killed
    trainer.sink.close()
    again = HandoffSource(folder, checkpoint=checkpoint)
    assert _seqs(again.read(0)) == [6, 7, 8]  # read again, nothing skipped, nothing before
    again.commit()
    assert _seqs(HandoffSource(folder, checkpoint=checkpoint).read(0)) == []


def test_files_are_deleted_only_once_committed_to_their_end(tmp_path: Path) -> None:
    checkpoint = tmp_path / "offsets.json"
    folder = tmp_path / "handoff"
    trainer = _Trainer(folder, max_bytes=300)
    source = HandoffSource(folder, checkpoint=checkpoint)
    trainer.run(range(8))
    assert _seqs(source.read(0)) == list(range(8))
    files = len(list(folder.iterdir()))
    assert files > 2
    assert _seqs(source.read(0)) == []
    assert len(list(folder.iterdir())) == files  # read but not delivered: kept
    source.commit()
    source.read(0)
    assert len(list(folder.iterdir())) == 1  # committed: only the writer's current file is left
    trainer.sink.close()
    assert _seqs(HandoffSource(folder, checkpoint=checkpoint).read(0)) == []


def test_an_unreadable_checkpoint_is_one_problem_and_everything_is_read(tmp_path: Path) -> None:
    folder, checkpoint = tmp_path / "handoff", tmp_path / "offsets.json"
    recorder = OpRecorder("job-1")
    recorder.comm("0", 2, 0, 0).enter("barrier", 0, T0)[END] = T0 + 1
    FolderSink(folder, "rank0")(recorder.messages(T0 + 10))
    for content in (b"{not json", b'{"rank0.000001.jsonl": -3}', b"[1, 2]"):
        checkpoint.write_bytes(content)
        source = HandoffSource(folder, checkpoint=checkpoint)
        reading = source.read(0)
        assert _seqs(reading) == [0]
        assert (
            len(reading.problems) == 1
            and "reading every file from its start" in reading.problems[0]
        )
        assert source.read(0).problems == []  # said once


def test_a_checkpoint_that_cannot_be_written_is_said_once(tmp_path: Path) -> None:
    folder = tmp_path / "handoff"
    recorder = OpRecorder("job-1")
    recorder.comm("0", 2, 0, 0).enter("barrier", 0, T0)[END] = T0 + 1
    FolderSink(folder, "rank0")(recorder.messages(T0 + 10))
    source = HandoffSource(folder, checkpoint=tmp_path / "missing-dir" / "offsets.json")
    source.read(0)
    problem = source.commit()
    assert problem is not None and "cannot write the checkpoint" in problem
    assert source.commit() is None  # not repeated while it keeps failing


class Counting:
    """A source that counts its rounds; optionally failing for a while."""

    def __init__(self, name: str, interval_s: float, failing: int = 0) -> None:
        self.name, self.interval_s, self.failing, self.rounds = name, interval_s, failing, 0

    def read(self, now_ns: int) -> Reading:
        self.rounds += 1
        if self.rounds <= self.failing:
            message = "disk on fire"
            raise OSError(message)
        heartbeat = Collective(
            v=1,
            kind="collective",
            job="j",
            comm="c",
            comm_size=1,
            rank=0,
            global_rank=0,
            ts_ns=now_ns,
            ops=Ops(seq=(), op=(), bytes=(), enter_ns=(), end_ns=()),
        )
        return Reading(messages=[heartbeat])

    def close(self) -> None:
        pass


def test_agent_runs_each_source_on_its_own_interval() -> None:
    clock = {"now": 0.0}
    fast, slow = Counting("fast", 1.0), Counting("slow", 5.0, failing=2)
    sent: list[C4Model] = []
    reports: list[str] = []
    agent = Agent(
        [fast, slow],
        sent.append,
        reports.append,
        clock_ns=lambda: T0,
        monotonic=lambda: clock["now"],
    )
    waits = []
    while clock["now"] < 20.0:
        waits.append(agent.step())
        clock["now"] += 0.5
    assert fast.rounds == 20 and slow.rounds == 4  # at 0, 5, 10, 15
    assert reports == ["source slow: failed (OSError: disk on fire)", "source slow: recovered"]
    assert agent.counts.failed_rounds == 2 and len(sent) == 20 + 2
    assert max(waits) <= 1.0

"""The torch instrumentation in a one-process gloo group: every way of taking end times."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from producers.handoff import HandoffSource
from producers.torch_taps import Entered
from schemas.messages import Collective

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import json, os, sys, time
import torch, torch.distributed as dist
from producers.torch_hooks import instrument
from producers.torch_sinks import folder_sink
completion, folder = sys.argv[1], sys.argv[3]
native = {"c++": True, "python": False, "default": None}[sys.argv[2]]
dist.init_process_group("gloo", rank=0, world_size=1)
instrumentation = instrument("job-u", folder_sink(folder, "rank0"), interval_s=0.05,
                             node="node-000", gpu=0, completion=completion, native=native)
sub = dist.new_group([0])
tensor = torch.ones(64)
returned = []  # when each allreduce call returned: its end cannot be later
for _ in range(20):
    dist.all_reduce(tensor)
    returned.append(time.time_ns())
    dist.broadcast(tensor, 0, group=sub)
time.sleep(0.2)  # an idle stretch: heartbeats
dist.barrier()
instrumentation.close()
dist.destroy_process_group()
with open(os.path.join(folder, "returned.json"), "w") as out:
    json.dump({"returned": returned, "problem": instrumentation.native_problem}, out)
"""


def _run_worker(
    folder: Path, completion: str, native: str, **env: str
) -> subprocess.CompletedProcess[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    environment = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONPATH": str(ROOT),
        "PYTHONWARNINGS": "ignore",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", WORKER, completion, native, str(folder)],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # the first run on a machine builds the C++ hooks (about 15 s)
    )


@pytest.mark.parametrize(
    ("completion", "native"),
    [("auto", "c++"), ("future", "c++"), ("poll", "c++"), ("future", "python"), ("poll", "python")],
)
def test_every_op_is_recorded_once_completed_with_heartbeats(
    tmp_path: Path, completion: str, native: str
) -> None:
    result = _run_worker(tmp_path, completion, native)
    assert result.returncode == 0, result.stderr[-2000:]

    reading = HandoffSource(tmp_path).read(0)
    assert reading.problems == []
    messages = [m for m in reading.messages if isinstance(m, Collective)]
    final: dict[tuple[str, int], tuple[str, int, int, int | None]] = {}
    for message in messages:
        assert (message.job, message.node, message.gpu) == ("job-u", "node-000", 0)
        for seq, op, nbytes, enter, end in zip(
            message.ops.seq,
            message.ops.op,
            message.ops.bytes,
            message.ops.enter_ns,
            message.ops.end_ns,
            strict=True,
        ):
            final[(message.comm, seq)] = (op, nbytes, enter, end)
    world = {seq: v for (comm, seq), v in final.items() if comm == "0"}
    sub = {seq: v for (comm, seq), v in final.items() if comm == "1"}
    assert [v[0] for _, v in sorted(world.items())] == ["allreduce"] * 20 + ["barrier"]
    assert [v[0] for _, v in sorted(sub.items())] == ["broadcast"] * 20
    assert world[0][1] == 64 * 4 and world[20][1] == 0
    assert all(end is not None and end >= enter for _, _, enter, end in final.values())
    worker = json.loads((tmp_path / "returned.json").read_text())
    assert worker["problem"] is None  # the C++ helper builds here
    if completion != "poll":  # exact ends: before the call returned (a poller's may be later)
        for seq, returned in enumerate(worker["returned"]):
            end = world[seq][3]
            assert end is not None and end <= returned, (seq, end, returned)
    heartbeats = [m for m in messages if len(m.ops) == 0]
    assert {m.comm for m in heartbeats} == {"0", "1"}  # both groups kept reporting
    # Sent in time order, each communicator's ts_ns never goes back.
    for comm in ("0", "1"):
        times = [m.ts_ns for m in messages if m.comm == comm]
        assert times == sorted(times)


def test_auto_records_in_python_and_says_why_where_the_helper_cannot_be_built(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    no_compiler = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "CXX": "/nonexistent/c++"}
    result = _run_worker(folder, "auto", "default", **no_compiler)
    assert result.returncode == 0, result.stderr[-2000:]
    reason = [line for line in result.stderr.splitlines() if "C++ hooks" in line]
    assert len(reason) == 1 and reason[0].endswith("recording in Python"), result.stderr
    worker = json.loads((folder / "returned.json").read_text())
    assert worker["problem"].startswith("cannot build the C++ hooks")
    reading = HandoffSource(folder).read(0)
    ops = [
        (enter, end)
        for message in reading.messages
        if isinstance(message, Collective)
        for enter, end in zip(message.ops.enter_ns, message.ops.end_ns, strict=True)
        if end is not None
    ]
    assert len(ops) == 41 and all(end >= enter for enter, end in ops)  # every op ended

    asked = _run_worker(tmp_path / "out", "auto", "c++", **no_compiler)
    assert asked.returncode != 0
    assert "InstrumentationError: cannot build the C++ hooks" in asked.stderr


Drained = tuple[list[Entered], list[tuple[int, int]], int]


class _FakeTap:
    """What a C++ tap hands the batching thread: drains queued by the test."""

    def __init__(self) -> None:
        self.drains: list[Drained] = []

    def drain(self) -> Drained:
        return self.drains.pop(0) if self.drains else ([], [], 0)

    def end_blind(self, now_ns: int) -> None:
        """Only called at close, which this test does not reach."""


def test_drained_ops_follow_the_order_entered_p2p_goes_to_the_pair_and_late_ends_land() -> None:
    from torch._C import _distributed_c10d

    from producers.torch_hooks import TorchInstrumentation, _Tapped

    names = _distributed_c10d.HookOpName
    allreduce, send, recv = int(names.ALLREDUCE), int(names.SEND), int(names.RECV)
    sent: list[Collective] = []
    instrumentation = TorchInstrumentation("job-t", sent.extend, native=False)
    tap = _FakeTap()
    members = [0, 3, 5]  # global ranks of the group's ranks 0, 1, 2; this rank is 3
    log = instrumentation.recorder.comm("7", 3, 1, 3)
    instrumentation._taps.append(_Tapped(tap, "7", log, members, 3))
    t = 1_700_000_000_000_000_000
    tap.drains.append(
        (
            [  # (id, op, root = the peer's group rank, bytes, enter, end or 0 while running)
                (0, allreduce, -1, 64, t, t + 10),
                (1, send, 2, 8, t + 20, t + 25),
                (2, allreduce, -1, 64, t + 30, 0),
                (3, recv, 0, 8, t + 40, 0),
                (4, send, 2, 8, t + 50, t + 55),
                (5, send, 9, 8, t + 60, t + 65),  # no such peer: counted, not recorded
                (6, 255, -1, 8, t + 70, t + 75),  # no such op: counted, not recorded
            ],
            [],
            0,
        )
    )
    tap.drains.append(([], [(2, t + 90), (3, t + 95), (99, t + 99)], 2))  # 99: not ours
    instrumentation.flush()
    first = {message.comm: message.ops for message in sent}
    assert first["7"].seq == (0, 1) and first["7"].end_ns == (t + 10, None)
    assert first["7:p2p:3-5"].seq == (0, 1) and first["7:p2p:3-5"].end_ns == (t + 25, t + 55)
    assert first["7:p2p:0-3"].op == ("recv",) and first["7:p2p:0-3"].end_ns == (None,)
    assert {m.comm: (m.comm_size, m.rank) for m in sent}["7:p2p:0-3"] == (2, 1)
    sent.clear()
    instrumentation.flush()
    later = {message.comm: message.ops for message in sent}
    assert later["7"].seq == (1,) and later["7"].end_ns == (t + 90,)  # reported ended now
    assert later["7:p2p:0-3"].end_ns == (t + 95,)
    assert len(later["7:p2p:3-5"]) == 0  # a heartbeat
    assert instrumentation.errors() == 2 + 2  # the C++ hooks' own count and the two above

"""The torch instrumentation in a one-process gloo group: every way of taking end times."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from producers.handoff import HandoffSource
from producers.oplog import END
from producers.torch_ends import EndStamper
from schemas.messages import Collective

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import json, os, sys, time
import torch, torch.distributed as dist
from producers.torch_hooks import folder_sink, instrument
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
    json.dump({"returned": returned, "problem": instrumentation.stamper_problem}, out)
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
        timeout=300,  # the first run on a machine builds the C++ helper (about 15 s)
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


def test_auto_polls_and_says_why_where_the_helper_cannot_be_built(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    no_compiler = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "CXX": "/nonexistent/c++"}
    result = _run_worker(folder, "auto", "default", **no_compiler)
    assert result.returncode == 0, result.stderr[-2000:]
    reason = [line for line in result.stderr.splitlines() if "end-time helper" in line]
    assert len(reason) == 1 and reason[0].endswith("end times taken in Python"), result.stderr
    worker = json.loads((folder / "returned.json").read_text())
    assert worker["problem"].startswith("cannot build the C++ end-time helper")
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
    assert "InstrumentationError: cannot build the C++ end-time helper" in asked.stderr


class _Work:
    def __init__(self, completed: bool) -> None:
        self.completed = completed

    def is_completed(self) -> bool:
        return self.completed


def test_stamped_ends_are_read_and_a_reused_cell_falls_back_to_the_work() -> None:
    from producers.torch_hooks import TorchInstrumentation

    sent: list[Collective] = []
    instrumentation = TorchInstrumentation("job-s", sent.extend, completion="poll", native=False)
    cells = {0: 1_700_000_000_000_000_500, 1: 0, 2: -1, 3: -1}  # done, running, reused x2
    instrumentation.stamper = EndStamper(
        stamp_on_end=lambda work: -1,
        poll_on_end=lambda work: -1,
        set_poll_period_us=lambda period: None,
        ends_of=lambda slots: [cells[s] for s in slots],
    )
    log = instrumentation.recorder.comm("0", 2, 0, 0)
    records = [log.enter("allreduce", 8, 1_700_000_000_000_000_000 + i) for i in range(4)]
    works: list[Any] = [_Work(False), _Work(False), _Work(True), _Work(False)]
    instrumentation._stamped.extend((records[i], i, works[i]) for i in range(4))
    instrumentation.flush()
    assert records[0][END] == 1_700_000_000_000_000_500  # the C++ callback's time
    assert records[1][END] is None and len(instrumentation._stamped) == 1  # asked again later
    assert records[2][END] is not None  # cell reused, the Work says it finished: bounded now
    assert records[3][END] is None  # cell reused, the Work still runs: polled from now on
    cells[1] = 1_700_000_000_000_000_900
    works[3].completed = True
    instrumentation.flush()
    assert records[1][END] == 1_700_000_000_000_000_900 and records[3][END] is not None
    assert not instrumentation._stamped and not instrumentation._unfinished
    assert sent[-1].ops.end_ns[-2:] == (1_700_000_000_000_000_900, records[3][END])

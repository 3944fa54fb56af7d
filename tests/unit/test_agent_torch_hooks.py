"""The torch instrumentation in a one-process gloo group: both ways of taking end times."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from producers.handoff import HandoffSource
from schemas.messages import Collective

ROOT = Path(__file__).resolve().parents[2]

WORKER = """
import os, sys, time
import torch, torch.distributed as dist
from producers.torch_hooks import folder_sink, instrument
completion, folder = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", rank=0, world_size=1)
instrumentation = instrument("job-u", folder_sink(folder, "rank0"), interval_s=0.05,
                             node="node-000", gpu=0, completion=completion)
sub = dist.new_group([0])
tensor = torch.ones(64)
for _ in range(20):
    dist.all_reduce(tensor)
    dist.broadcast(tensor, 0, group=sub)
time.sleep(0.2)  # an idle stretch: heartbeats
dist.barrier()
instrumentation.close()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("completion", ["future", "poll"])
def test_every_op_is_recorded_once_completed_with_heartbeats(
    tmp_path: Path, completion: str
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONPATH": str(ROOT),
        "PYTHONWARNINGS": "ignore",
    }
    result = subprocess.run(
        [sys.executable, "-c", WORKER, completion, str(tmp_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
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
    heartbeats = [m for m in messages if len(m.ops) == 0]
    assert {m.comm for m in heartbeats} == {"0", "1"}  # both groups kept reporting
    # Sent in time order, each communicator's ts_ns never goes back.
    for comm in ("0", "1"):
        times = [m.ts_ns for m in messages if m.comm == comm]
        assert times == sorted(times)

"""Real gloo jobs that know nothing of c4, started under `c4 run`: each rank reports where it
runs (one member message) and its allreduces, in the handoff folder, with no code change.

One job starts its ranks with ``torch.multiprocessing.spawn`` inside a (pretend) Slurm
step; one is started by torchrun (``python -m torch.distributed.run``, whose launcher
process carries the switch too and stays silent). No broker: the agent's side is in
test_instrument_hook.
"""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from producers.handoff import HandoffSource
from schemas.messages import Collective, Member
from tests.unit.test_instrument_hook import c4_lines, clean_env

STEPS = 12
TRAIN = f'''"""A plain gloo training script."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def train(rank, world_size, init_method):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    grad = torch.ones(1024)
    for _ in range({STEPS}):
        grad = torch.tanh(grad)
        dist.all_reduce(grad)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
    else:
        world_size, port = int(sys.argv[1]), sys.argv[2]
        mp.spawn(train, args=(world_size, f"tcp://127.0.0.1:{{port}}"), nprocs=world_size)
    print("trained", flush=True)
'''


def test_the_training_script_imports_nothing_of_c4() -> None:
    roots = set()
    for node in ast.walk(ast.parse(TRAIN)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots == {"os", "sys", "torch"}
    assert "c4" not in TRAIN and "producers" not in TRAIN


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_job(
    tmp_path: Path, c4_options: list[str], command: list[str], **env: str
) -> tuple[list[Member], list[Collective], str]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    result = subprocess.run(
        [sys.executable, "-m", "c4.cli", "run", *c4_options, "--", *command],
        cwd=tmp_path,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,  # the first instrumented run on a machine builds the C++ hooks
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained" in result.stdout
    reading = HandoffSource(tmp_path / "handoff").read(0)
    assert reading.problems == []
    members = [m for m in reading.messages if isinstance(m, Member)]
    collectives = [m for m in reading.messages if isinstance(m, Collective)]
    return members, collectives, result.stderr


def _allreduces_per_rank(collectives: list[Collective]) -> dict[int, Counter[str]]:
    ops: dict[int, dict[int, str]] = {}
    for message in collectives:
        if message.comm == "0":  # the default group
            ops.setdefault(message.global_rank, {}).update(
                zip(message.ops.seq, message.ops.op, strict=True)
            )
    return {rank: Counter(by_seq.values()) for rank, by_seq in ops.items()}


def test_a_spawned_job_in_a_slurm_step_reports_its_members_and_allreduces(
    tmp_path: Path,
) -> None:
    world = 4
    slurm = {
        "SLURM_JOB_ID": "8086",
        "SLURMD_NODENAME": "node-003",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_JOB_NODELIST": "node-[000-003]",
    }
    members, collectives, stderr = _run_job(
        tmp_path,
        ["--handoff", str(tmp_path / "handoff")],
        [sys.executable, "train.py", str(world), str(_free_port())],
        **slurm,
    )
    assert c4_lines(stderr) == []
    assert sorted(m.rank for m in members) == list(range(world))
    for member in members:
        assert (member.job, member.world_size, member.node, member.restart) == (
            "8086",
            world,
            "node-003",
            1,
        )
        assert member.job_nodes == ("node-000", "node-001", "node-002", "node-003")
        assert member.gpu is None  # CPU: the local rank is no GPU
    assert {m.job for m in collectives} == {"8086"}
    assert {m.node for m in collectives} == {"node-003"}
    per_rank = _allreduces_per_rank(collectives)
    assert per_rank == {rank: Counter(allreduce=STEPS, barrier=1) for rank in range(world)}
    # One file per rank, named by the job and the rank torch.distributed gave it.
    assert sorted(p.name for p in (tmp_path / "handoff").iterdir()) == [
        f"8086.rank{rank}.000001.jsonl" for rank in range(world)
    ]


@pytest.mark.parametrize("explicit_job", [False, True])
def test_a_torchrun_job_reports_its_members_and_allreduces(
    tmp_path: Path, explicit_job: bool
) -> None:
    world = 2
    options = ["--handoff", str(tmp_path / "handoff"), "--node", "node-7"]
    options += ["--job", "job-t"] if explicit_job else []
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", str(world), "train.py"]
    members, collectives, stderr = _run_job(tmp_path, options, torchrun)
    assert c4_lines(stderr) == []  # the launcher process loaded c10d and stayed silent
    assert sorted((m.rank, m.local_rank) for m in members) == [(0, 0), (1, 1)]
    jobs = {m.job for m in members}
    assert len(jobs) == 1
    job = jobs.pop()
    if explicit_job:
        assert job == "job-t"
    else:
        assert job not in ("", "none", "job-t")  # torchrun's run id, the same on every rank
    for member in members:
        assert (member.world_size, member.node, member.restart) == (world, "node-7", 0)
        assert member.job_nodes is None and member.gpu is None
    assert {m.job for m in collectives} == {job}
    per_rank = _allreduces_per_rank(collectives)
    assert per_rank == {rank: Counter(allreduce=STEPS, barrier=1) for rank in range(world)}

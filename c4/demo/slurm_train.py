"""A small data-parallel training job for ``c4 demo --slurm`` and the Slurm tests.

It imports nothing of c4: an unmodified training script, instrumented only by ``c4 run``
(``python slurm_train.py OUT STEPS``). Started by ``srun`` (one task per node), each task
under ``c4 run``: DDP over gloo on a small model with real gradients, a few hundred steps,
rank 0 checkpointing every 20 steps (``<out>/progress.r<restart>`` holds the last step
checkpointed) and every rank resuming from the checkpoint after a requeue. Each task writes
its pid and node (``<out>/pids/r<restart>.rank<rank>``) so that the demo or a test can stop
it, and rank 0 writes ``<out>/done.r<restart>`` when the training completed.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    out = Path(sys.argv[1])
    steps = int(sys.argv[2])
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    base = 20000 + (int(os.environ["SLURM_JOB_ID"]) * 10) % 20000
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(base + restart)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    (out / "pids").mkdir(parents=True, exist_ok=True)
    node = os.environ.get("SLURMD_NODENAME", "")
    (out / "pids" / f"r{restart}.rank{rank}").write_text(f"{os.getpid()} {node}\n")
    torch.manual_seed(rank)
    torch.set_num_threads(1)  # the ranks share a few cores: one compute thread each
    layers = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)
    )
    checkpoint = out / "checkpoint.pt"
    first = 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        layers.load_state_dict(saved["model"])
        first = saved["step"]
    model = DistributedDataParallel(layers)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(first, steps):
        batch = torch.randn(64, 256)
        loss = model(batch).pow(2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        time.sleep(0.05)  # the rest of a step: data loading, a bigger model's compute
        if rank == 0 and step % 20 == 0:
            torch.save({"model": layers.state_dict(), "step": step}, out / "checkpoint.tmp")
            (out / "checkpoint.tmp").replace(checkpoint)
            (out / f"progress.r{restart}").write_text(f"{step}\n")
    dist.barrier()
    if rank == 0:
        (out / f"done.r{restart}").write_text(f"{steps}\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

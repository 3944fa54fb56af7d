"""The Slurm demo's training job and what it reads of Slurm.

The job is `slurm_train.py` beside this module (shipped in the package, importing nothing of
c4), submitted with ``sbatch --requeue`` on 3 of the cluster's 4 nodes, each task as
``srun bash -c 'C4_HANDOFF_DIR=<handoff>/$SLURMD_NODENAME exec python -m c4.cli run --
python slurm_train.py OUT STEPS'``: one handoff folder per node, as each real node has its
own, read by that node's agent. `JobFiles` reads what the tasks write (pids, progress);
`SlurmView` what Slurm says (``sinfo -R``, ``scontrol show job``), through the actions'
Slurm driver.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from actions.drivers.slurm.cli import (
    ENDED_STATES,
    CommandRunner,
    JobInfo,
    NodeInfo,
    Slurm,
    parse_fields,
)
from c4.demo import DemoError
from c4.demo.slurm_figures import JobEnd

TRAINING_SCRIPT = Path(__file__).with_name("slurm_train.py")
JOB_NODES = 3  # of the cluster's 4: a spare for the requeue
T = TypeVar("T")


def job_script(work: Path, steps: int) -> str:
    """The batch script: requeueable, one task per node, each under ``c4 run``."""
    python = shlex.quote(sys.executable)
    handoff = shlex.quote(str(work / "handoff"))
    task = (
        f"C4_HANDOFF_DIR={handoff}/$SLURMD_NODENAME exec {python} -m c4.cli run -- "
        f"{python} {shlex.quote(str(TRAINING_SCRIPT))} {shlex.quote(str(work / 'train'))} {steps}"
    )
    return (
        "#!/bin/bash\n"
        f"#SBATCH -J c4-demo\n#SBATCH -N {JOB_NODES}\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --requeue\n#SBATCH -o {work / 'logs'}/job-%j.out\n"
        f"srun bash -c {shlex.quote(task)}\n"
    )


@dataclass(frozen=True, slots=True)
class JobFiles:
    """What the training tasks write under ``<work>/train``."""

    folder: Path

    def ranks(self, restart: int) -> dict[int, tuple[int, str]]:
        """Run ``restart``'s ranks: rank -> (pid, node)."""
        out: dict[int, tuple[int, str]] = {}
        for path in (self.folder / "pids").glob(f"r{restart}.rank*"):
            rank = path.name.rpartition(".rank")[2]
            words = path.read_text(encoding="utf-8").split()
            if rank.isdigit() and len(words) == 2 and words[0].isdigit():
                out[int(rank)] = (int(words[0]), words[1])
        return dict(sorted(out.items()))

    def progress(self, restart: int) -> int | None:
        """The last step run ``restart`` checkpointed, if any."""
        path = self.folder / f"progress.r{restart}"
        try:
            text = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None


class SlurmView:
    """The job and the nodes as Slurm reports them (every call a Slurm command)."""

    def __init__(self, conf: Path) -> None:
        self.run = CommandRunner(str(conf))
        self.slurm = Slurm(self.run)

    def submit(self, script: Path) -> str:
        """``sbatch --parsable``; the job id."""
        done = self.run(["sbatch", "--parsable", str(script)])
        if done.returncode != 0:
            message = f"sbatch failed: {done.stderr.strip() or done.stdout.strip()}"
            raise DemoError(message)
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> JobInfo:
        """``scontrol show job``."""
        return self.slurm.job(job_id)

    def node(self, name: str) -> NodeInfo:
        """``sinfo`` of one node."""
        return self.slurm.node(name)

    def nodes_of(self, info: JobInfo) -> list[str]:
        """The job's nodes as names."""
        return self.slurm.expand(info.nodes)

    def reason(self, node: str) -> tuple[str, str]:
        """A drained node's reason as ``sinfo -R`` prints it: in full (``-o %E``), and the
        line of its default format (which cuts the reason at 20 characters)."""
        full = self.run(["sinfo", "-R", "-h", "-n", node, "-o", "%E"]).stdout.strip()
        line = self.run(["sinfo", "-R", "-h", "-n", node]).stdout.strip()
        return full, " ".join(line.split())

    def end(self, job_id: str) -> JobEnd:
        """The job's state, exit code, restart count and nodes."""
        text = self.run(["scontrol", "-o", "show", "job", job_id]).stdout
        fields = parse_fields(text)
        info = self.slurm.job(job_id)
        return JobEnd(job_id, info.state, fields.get("ExitCode", "?"), info.restarts, info.nodes)

    def cancel(self, job_id: str, timeout_s: float = 60.0) -> str:
        """``scancel`` the job unless it ended; wait until it has (its tasks gone)."""
        info = self.slurm.job(job_id)
        if info.state in ENDED_STATES:
            return info.state
        self.run(["scancel", "--full", job_id])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self.slurm.job(job_id)
            if info.state in ENDED_STATES:
                return info.state
            time.sleep(0.5)
        return info.state


def wait_until(
    probe: Callable[[], T | None], timeout_s: float, what: str, check: Callable[[], None]
) -> T:
    """Poll ``probe`` until it returns something (not None), or raise `DemoError` naming
    ``what``; ``check`` runs every round (a worker that died is an error at once)."""
    deadline = time.monotonic() + timeout_s
    while True:
        check()
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout_s:.0f} s waiting for {what}"
            raise DemoError(message)
        time.sleep(0.2)

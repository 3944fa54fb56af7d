"""Who a training process is, from its environment: Slurm's, torchrun's and c4's own.

`c4 run` turns its options into ``C4_*`` variables (`EXPLICIT`); they win over what Slurm
(``SLURM_JOB_ID``, ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
``SLURMD_NODENAME``, ``SLURM_RESTART_COUNT``, ``SLURM_JOB_NODELIST``), Kubernetes' downward
API (``NODE_NAME``, ``POD_NAME``, ``POD_NAMESPACE``, as c4's manifests set them) and torchrun
(``TORCHELASTIC_RUN_ID``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``TORCHELASTIC_RESTART_COUNT``) say, and torchrun wins over Slurm (it runs inside the Slurm
task). Once the process group is up, the rank and world size torch.distributed reports
replace the derived ones (`LaunchIdentity.in_group`). Pure: nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from producers.hostlist import HostlistError, expand_hostlist

# The variables `c4 run` sets from its options (and a user may set by hand).
ENABLE = "C4_INSTRUMENT"
EXPLICIT = {
    "job": "C4_JOB",
    "handoff": "C4_HANDOFF_DIR",
    "rank": "C4_RANK",
    "local_rank": "C4_LOCAL_RANK",
    "world_size": "C4_WORLD_SIZE",
    "node": "C4_NODE",
    "restart": "C4_RESTART",
    "port": "C4_PORT",
    "interval": "C4_INTERVAL_S",
}
# torchrun inside a requeued Slurm job: restart = Slurm's count x this + torchrun's, so the
# number only grows (a member report with a lower restart than seen is taken as stale).
SLURM_RESTART_WEIGHT = 1000
DEFAULT_INTERVAL_S = 1.0
_NOT_A_RUN_ID = {"", "none"}  # torchrun's run id when none was given
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class LaunchSettingError(ValueError):
    """A variable that cannot be used (``C4_RANK=abc``): the instrumentation stays off."""


@dataclass(frozen=True, slots=True)
class LaunchIdentity:
    """One training process: its job, place in the world, node and restart."""

    job: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    node: str
    host: str
    restart: int
    job_nodes: tuple[str, ...] | None
    port: str | None
    pod: str | None = None  # Kubernetes: namespace/name
    explicit: frozenset[str] = frozenset()  # the fields given by C4_* variables

    def in_group(self, rank: int, world_size: int) -> tuple[LaunchIdentity, list[str]]:
        """This identity with torch.distributed's rank and world size (an explicit one still
        wins); the disagreements with an explicit value, one line each."""
        notes = []
        if "rank" in self.explicit and self.rank != rank:
            notes.append(f"{EXPLICIT['rank']}={self.rank} but torch.distributed's rank is {rank}")
        if "world_size" in self.explicit and self.world_size != world_size:
            notes.append(
                f"{EXPLICIT['world_size']}={self.world_size} but torch.distributed's world size"
                f" is {world_size}"
            )
        return dataclasses.replace(
            self,
            rank=self.rank if "rank" in self.explicit else rank,
            world_size=self.world_size if "world_size" in self.explicit else world_size,
        ), notes


def enabled(env: Mapping[str, str]) -> bool:
    """Whether ``C4_INSTRUMENT`` asks for instrumentation (unset, empty, 0, false, no, off:
    not)."""
    return env.get(ENABLE, "").strip().lower() not in ("", "0", "false", "no", "off")


def resolve_identity(env: Mapping[str, str], hostname: str) -> LaunchIdentity:
    """The identity ``env`` describes (a LaunchSettingError for a value that is unusable)."""
    explicit = frozenset(
        field for field, name in EXPLICIT.items() if env.get(name, "").strip() != ""
    )
    job = _first(env, EXPLICIT["job"], "SLURM_JOB_ID")
    if job is None:
        run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
        job = None if run_id.lower() in _NOT_A_RUN_ID else run_id
    rank = _first_int(env, EXPLICIT["rank"], "RANK", "SLURM_PROCID")
    local_rank = _first_int(env, EXPLICIT["local_rank"], "LOCAL_RANK", "SLURM_LOCALID")
    world_size = _first_int(env, EXPLICIT["world_size"], "WORLD_SIZE", "SLURM_NTASKS")
    if world_size is not None and world_size < 1:
        message = f"world size {world_size} is not positive"
        raise LaunchSettingError(message)
    host = hostname.strip() or "localhost"
    node = _first(env, EXPLICIT["node"], "SLURMD_NODENAME", "NODE_NAME") or host
    return LaunchIdentity(
        job=job,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        node=node,
        host=host,
        restart=_restart(env),
        job_nodes=_job_nodes(env),
        port=port_of(env),
        pod=_pod(env),
        explicit=explicit,
    )


def _pod(env: Mapping[str, str]) -> str | None:
    """``namespace/name`` of the rank's pod from the downward API; None outside a pod."""
    name = _first(env, "POD_NAME")
    if name is None:
        return None
    return f"{_first(env, 'POD_NAMESPACE') or 'default'}/{name}"


def _restart(env: Mapping[str, str]) -> int:
    explicit = _first_int(env, EXPLICIT["restart"])
    if explicit is not None:
        return explicit
    slurm = _first_int(env, "SLURM_RESTART_COUNT")
    torchrun = _first_int(env, "TORCHELASTIC_RESTART_COUNT")
    if slurm is None or torchrun is None:
        return slurm or torchrun or 0
    return slurm * SLURM_RESTART_WEIGHT + min(torchrun, SLURM_RESTART_WEIGHT - 1)


def _job_nodes(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """Slurm's nodes of the job, expanded; None when unset or not in Slurm's syntax."""
    text = _first(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if text is None:
        return None
    try:
        return tuple(expand_hostlist(text)) or None
    except HostlistError:
        return None  # optional in the member message: a rank reports what it can see


def port_of(env: Mapping[str, str]) -> str | None:
    """This rank's NIC port (``mlx5_1:1``): ``C4_PORT``, else ``NCCL_IB_HCA`` when it names
    exactly one device (port 1 when it names none), else None."""
    explicit = _first(env, EXPLICIT["port"])
    if explicit is not None:
        return explicit
    hca = env.get("NCCL_IB_HCA", "").strip()
    if not hca or hca.startswith("^"):  # unset, or the devices NOT to use
        return None
    devices = [device.strip() for device in hca.lstrip("=").split(",") if device.strip()]
    if len(devices) != 1:
        return None
    device = devices[0]
    return device if ":" in device else f"{device}:1"


def handoff_dir(env: Mapping[str, str]) -> Path:
    """Where the rank writes for the node agent: ``C4_HANDOFF_DIR``, else the handoff folder
    of the stack directory (``C4_STACK_DIR``, default ``~/.cache/c4``)."""
    explicit = _first(env, EXPLICIT["handoff"])
    if explicit is not None:
        return Path(explicit).expanduser()
    stack = _first(env, "C4_STACK_DIR")
    return (Path(stack).expanduser() if stack else Path.home() / ".cache" / "c4") / "handoff"


def interval_s(env: Mapping[str, str]) -> float:
    """Seconds between the instrumentation's reports (``C4_INTERVAL_S``, default 1)."""
    text = _first(env, EXPLICIT["interval"])
    if text is None:
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.01 <= value <= 3600:
        message = f"{EXPLICIT['interval']}={text!r} is not a number of seconds in [0.01, 3600]"
        raise LaunchSettingError(message)
    return value


def writer_name(job: str, rank: int) -> str:
    """The rank's file name stem in the handoff folder: ``<job>.rank<N>``, made safe."""
    return f"{_SAFE.sub('_', job)[:100]}.rank{rank}"


def hostname() -> str:
    """This host's name, as the kernel has it."""
    return os.uname().nodename


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def _first_int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            if not (value.isascii() and value.isdigit()):
                message = f"{name}={value[:40]!r} is not a non-negative integer"
                raise LaunchSettingError(message)
            return int(value)
    return None

"""The stack's Slurm: munged, slurmctld and one slurmd per node name, all on 127.0.0.1.

A real Slurm cluster from Debian's packages (``slurm-wlm``, ``munge``; apt-installed when
root and missing) for the tests and the demo: ``sbatch``, drains with reasons, ``sinfo -R``
and ``scontrol requeue`` behave as on a cluster of ``stack_slurm_nodes`` nodes named
``node-000``... Every daemon runs in the foreground under our pid file, with its
configuration, state, spool and log in ``<stack_dir>/run/slurm-<port>/``; clients reach it
with ``SLURM_CONF`` set to the ``slurm.conf`` there (`slurm_conf_path`).

munged runs as the ``munge`` user and refuses a socket whose folders are not searchable by
all, so its key and socket live in ``/run/c4-munge-<port>`` rather than under a home folder.
Draining and requeueing need Slurm's administrator: this stack is root's only. Each ``up``
starts slurmctld with a clear state (``-c``): no job or drain outlives the stack.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from c4.stack.supervise import (
    HOST,
    Component,
    ComponentStatus,
    Progress,
    StackError,
    component_status,
    installed,
    locked,
    our_pid,
    port_answers,
    require,
    send_signal,
    spawn,
    taken_port,
    wait_gone,
    wait_ready,
)

if TYPE_CHECKING:
    from c4.settings import Settings

PACKAGES = ("slurm-wlm", "munge")
_HINT = "Slurm not found: run sudo apt-get install -y slurm-wlm munge"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
MUNGE_USER = "munge"
CPUS_PER_NODE = 2  # declared, not measured (config_overrides): the jobs here are small


def node_names(settings: Settings) -> list[str]:
    """The simulated nodes, named like the demo's topology."""
    return [f"node-{index:03d}" for index in range(settings.stack_slurm_nodes)]


def run_dir(settings: Settings) -> Path:
    """The cluster's folder: configuration, state, spools, logs and pid files."""
    return settings.stack_dir / "run" / f"slurm-{settings.stack_slurm_port}"


def slurm_conf_path(settings: Settings) -> Path:
    """The ``slurm.conf`` clients use (``SLURM_CONF``)."""
    return run_dir(settings) / "slurm.conf"


def munge_dir(settings: Settings) -> Path:
    """munged's key, socket and logs: a folder the munge user can reach."""
    return Path("/run") / f"c4-munge-{settings.stack_slurm_port}"


def slurm_env(settings: Settings) -> dict[str, str]:
    """The environment a Slurm client of this cluster needs."""
    return {"SLURM_CONF": str(slurm_conf_path(settings))}


def components(settings: Settings) -> list[Component]:
    """munged, slurmctld and the slurmds, in start order."""
    folder = run_dir(settings)
    port = settings.stack_slurm_port
    daemons = [
        Component("munged", munge_dir(settings), ()),
        Component("slurmctld", folder, ((port, "C4_STACK_SLURM_PORT"),)),
    ]
    for index, node in enumerate(node_names(settings)):
        daemons.append(
            Component(f"slurmd-{node}", folder, ((port + 1 + index, "C4_STACK_SLURM_PORT"),))
        )
    return daemons


def render_slurm_conf(settings: Settings) -> str:
    """The cluster's ``slurm.conf``: one partition ``c4`` of every node, requeue allowed."""
    folder = run_dir(settings)
    names = node_names(settings)
    port = settings.stack_slurm_port
    last = f"{len(names) - 1:03d}"
    return "\n".join(
        [
            "# Written by c4 stack up: a local Slurm cluster on 127.0.0.1.",
            "ClusterName=c4",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_dir(settings) / 'munge.socket'}",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool-%n'}",
            f"SlurmctldPidFile={folder / 'slurmctld.daemon.pid'}",
            f"SlurmdPidFile={folder / 'slurmd-%n.daemon.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.daemon.log'}",
            f"SlurmdLogFile={folder / 'slurmd-%n.daemon.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # Every slurmd runs on this one machine: the declared CPUs are not checked.
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "JobRequeue=1",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=300",
            "KillWait=5",
            f"NodeName=node-[000-{last}] NodeHostname=localhost NodeAddr={HOST}"
            f" Port=[{port + 1}-{port + len(names)}] CPUs={CPUS_PER_NODE} RealMemory=2000"
            " State=UNKNOWN",
            "PartitionName=c4 Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
            "",
        ]
    )


def _prepare_munge(folder: Path) -> None:
    try:
        user = pwd.getpwnam(MUNGE_USER)
    except KeyError as error:
        raise StackError(_HINT) from error
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, user.pw_uid, user.pw_gid)
    folder.chmod(0o755)
    key = folder / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
    os.chown(key, user.pw_uid, user.pw_gid)
    key.chmod(0o400)


def _start(settings: Settings, component: Component) -> int:
    conf = str(slurm_conf_path(settings))
    if component.name == "munged":
        folder = component.run_dir
        argv = [
            require("setpriv", _HINT),
            f"--reuid={MUNGE_USER}",
            f"--regid={MUNGE_USER}",
            "--init-groups",
            installed("munged", PACKAGES, _HINT),
            "-F",
            f"--socket={folder / 'munge.socket'}",
            f"--key-file={folder / 'munge.key'}",
            f"--pid-file={folder / 'munged.daemon.pid'}",
            f"--log-file={folder / 'munged.daemon.log'}",
            f"--seed-file={folder / 'munged.seed'}",
        ]
    elif component.name == "slurmctld":
        argv = [installed("slurmctld", PACKAGES, _HINT), "-D", "-c", "-f", conf]
    else:
        node = component.name.removeprefix("slurmd-")
        (component.run_dir / f"spool-{node}").mkdir(exist_ok=True)
        argv = [installed("slurmd", PACKAGES, _HINT), "-D", "-N", node, "-f", conf]
    return spawn(argv, component.log_file, component.pid_file)


def _probe(component: Component) -> bool:
    if component.name == "munged":
        return (component.run_dir / "munge.socket").exists()
    return port_answers(component.port)


def _prober(component: Component) -> Callable[[float], bool]:
    def probe(timeout_s: float) -> bool:
        del timeout_s  # both checks are local and immediate
        return _probe(component)

    return probe


def _nodes_ready(settings: Settings) -> bool:
    """Whether every node has registered (no longer unknown, down or not responding)."""
    result = subprocess.run(  # noqa: S603 - fixed argv, no shell
        [require("sinfo", _HINT), "-h", "-N", "-o", "%N %T"],
        capture_output=True,
        text=True,
        env=dict(os.environ) | slurm_env(settings),
        timeout=10,
        check=False,
    )
    states = dict(line.split(maxsplit=1) for line in result.stdout.splitlines() if " " in line)
    return result.returncode == 0 and all(
        states.get(node, "unknown").rstrip("*").lower() in ("idle", "mixed", "allocated")
        for node in node_names(settings)
    )


def slurm_up(settings: Settings, progress: Progress | None = None) -> list[ComponentStatus]:
    """Start the cluster's daemons unless ours already run; return once every node is idle."""
    if os.geteuid() != 0:
        message = "the local Slurm cluster needs root (drains and requeues are an admin's)"
        raise StackError(message)
    daemons = components(settings)
    folder = run_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder / ".lock"):
        running = {c.name: pid for c in daemons if (pid := our_pid(c)) is not None}
        for component in daemons:
            taken = None if component.name in running else taken_port(component)
            if taken is not None:
                message = f"port {taken[0]} on {HOST} is taken: stop it or set {taken[1]}"
                raise StackError(message)
        if len(running) < len(daemons):
            installed("slurmctld", PACKAGES, _HINT)
            (folder / "state").mkdir(exist_ok=True)
            slurm_conf_path(settings).write_text(render_slurm_conf(settings), encoding="utf-8")
            _prepare_munge(munge_dir(settings))
        statuses = []
        for component in daemons:
            began = time.monotonic()
            pid = running.get(component.name)
            if pid is None:
                pid = _start(settings, component)
                if progress is not None:
                    progress(f"{component.name}: started pid {pid}")
            wait_ready(component, pid, _prober(component), READY_TIMEOUT_S)
            detail = (
                "already running"
                if component.name in running
                else f"started in {time.monotonic() - began:.1f} s, log {component.log_file}"
            )
            statuses.append(
                ComponentStatus(component.name, "running", pid, component.address, detail)
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _nodes_ready(settings):
            if time.monotonic() >= deadline:
                message = (
                    f"Slurm's nodes did not come up within {READY_TIMEOUT_S:.0f} s (log {folder})"
                )
                raise StackError(message)
            time.sleep(0.5)
    return statuses


def _cancel_jobs(settings: Settings) -> None:
    """Cancel every job of this cluster, so that no task outlives its slurmd."""
    scancel = shutil.which("scancel")
    if scancel is None:
        return
    subprocess.run(  # noqa: S603 - fixed argv, no shell
        [scancel, "--full", "--user=root"],
        capture_output=True,
        env=dict(os.environ) | slurm_env(settings),
        timeout=15,
        check=False,
    )


def slurm_down(settings: Settings) -> list[ComponentStatus]:
    """Stop the daemons ``slurm_up`` started (slurmds, slurmctld, then munged); idempotent."""
    daemons = components(settings)
    folder = run_dir(settings)
    if not folder.is_dir():
        return [component_status(c) for c in daemons]
    with locked(folder / ".lock"):
        if our_pid(daemons[1]) is not None:
            _cancel_jobs(settings)
        statuses = []
        for component in reversed(daemons):
            pid = our_pid(component)
            if pid is None:
                component.pid_file.unlink(missing_ok=True)
                statuses.append(component_status(component))
                continue
            send_signal(component, pid, signal.SIGTERM)
            if not wait_gone(pid, STOP_TIMEOUT_S):
                send_signal(component, pid, signal.SIGKILL)
                wait_gone(pid, STOP_TIMEOUT_S)
            component.pid_file.unlink(missing_ok=True)
            statuses.append(
                ComponentStatus(
                    component.name, "stopped", None, component.address, f"stopped pid {pid}"
                )
            )
        if our_pid(daemons[0]) is None:
            # munged's folder is ours and outside the stack folder (/run): leave nothing.
            shutil.rmtree(munge_dir(settings), ignore_errors=True)
    return list(reversed(statuses))


def slurm_status(settings: Settings) -> list[ComponentStatus]:
    """Each daemon's state; empty when this cluster was never started."""
    if not run_dir(settings).is_dir():
        return []
    return [component_status(c) for c in components(settings)]

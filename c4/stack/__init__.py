"""``c4 stack``: the local stack, a KRaft Kafka broker (jars from Maven Central) and Redis.

Both run detached on 127.0.0.1 with their data, log and pid file in a run folder per port,
``<stack_dir>/run/kafka-<port>/`` and ``<stack_dir>/run/redis-<port>/``; the Kafka jars live in
``<stack_dir>/kafka-<version>/lib`` and are shared by every port. ``stack_down`` only signals a
process whose pid file we wrote and whose command line is still the one we started.

With ``up --slurm`` a local Slurm cluster joins them (`slurm`: munged, slurmctld, one slurmd
per node name), with ``up --kube`` a Kubernetes API server (`kube`: etcd and kube-apiserver),
with ``up --monitoring`` a Prometheus scraping the workers' default ports with c4's rules and
an Alertmanager taking its alerts (`prometheus`, `alertmanager`); ``down`` stops them too
when they run.

One module per job: `maven` (the jars), `kafka` (broker and SASL configuration, start, probe),
`redis`, `slurm`, `kube`, `prometheus`, `alertmanager`, `node_exporter` (for the agent's
exporter sources), `supervise` (pid files, spawning, locks, waiting), `control` (up, down,
status, kill of Kafka and Redis). This module is the ``c4 stack`` command and re-exports what
the rest of c4 uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING

from c4.stack.alertmanager import (
    alertmanager_down,
    alertmanager_status,
    alertmanager_up,
    alertmanager_url,
)
from c4.stack.control import stack_down, stack_kill, stack_status, stack_up
from c4.stack.kafka import (
    kafka_properties_path,
    new_cluster_id,
    render_server_properties,
    stack_serves_sasl,
)
from c4.stack.kube import kube_down, kube_status, kube_up, kubeconfig_path
from c4.stack.maven import ensure_kafka_jars, kafka_home, render_pom
from c4.stack.prometheus import ScrapeSetup, prometheus_down, prometheus_status, prometheus_up
from c4.stack.slurm import slurm_conf_path, slurm_down, slurm_env, slurm_status, slurm_up
from c4.stack.supervise import HOST, ComponentStatus, Progress, StackError, State, port_answers

if TYPE_CHECKING:
    from c4.settings import Settings

__all__ = [
    "HOST",
    "ComponentStatus",
    "Progress",
    "StackError",
    "State",
    "ensure_kafka_jars",
    "format_status",
    "kafka_home",
    "kafka_properties_path",
    "kube_down",
    "kube_status",
    "kube_up",
    "kubeconfig_path",
    "monitoring_down",
    "monitoring_status",
    "monitoring_up",
    "new_cluster_id",
    "port_answers",
    "register",
    "render_pom",
    "render_server_properties",
    "slurm_conf_path",
    "slurm_down",
    "slurm_env",
    "slurm_status",
    "slurm_up",
    "stack_down",
    "stack_kill",
    "stack_serves_sasl",
    "stack_status",
    "stack_up",
]


def format_status(status: ComponentStatus) -> str:
    """One human line per component."""
    pid = f"pid {status.pid}" if status.pid is not None else "-"
    return f"{status.name:<6} {status.state:<8} {status.address:<16} {pid:<10} {status.detail}"


def _slurm_running(settings: Settings) -> bool:
    return any(status.state == "running" for status in slurm_status(settings))


def _kube_running(settings: Settings) -> bool:
    return any(status.state == "running" for status in kube_status(settings))


def monitoring_up(settings: Settings) -> list[ComponentStatus]:
    """Alertmanager, then a Prometheus sending it the alerts of c4's rules."""
    manager = alertmanager_up(settings, progress=_progress)
    address = alertmanager_url(settings).removeprefix("http://").rstrip("/")
    scraper = prometheus_up(settings, ScrapeSetup(alertmanagers=(address,)), _progress)
    return [manager, scraper]


def monitoring_status(settings: Settings) -> list[ComponentStatus]:
    """Alertmanager's and Prometheus's states."""
    return [alertmanager_status(settings), prometheus_status(settings)]


def monitoring_down(settings: Settings) -> list[ComponentStatus]:
    """Stop the Prometheus and Alertmanager ``up --monitoring`` started, when they run."""
    running = {status.name for status in monitoring_status(settings) if status.state == "running"}
    stopped = []
    if any(name.startswith("prometheus") for name in running):
        stopped.append(prometheus_down(settings))
    if any(name.startswith("alertmanager") for name in running):
        stopped.append(alertmanager_down(settings))
    return stopped


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "up":
        began = time.monotonic()
        statuses = stack_up(settings, progress=_progress)
        if args.slurm:
            statuses += slurm_up(settings, progress=_progress)
        if args.kube:
            statuses += kube_up(settings, progress=_progress)
        if args.monitoring:
            statuses += monitoring_up(settings)
        for status in statuses:
            print(format_status(status))
        print(f"stack up in {time.monotonic() - began:.1f} s")
        if args.slurm:
            print(f"export SLURM_CONF={slurm_conf_path(settings)}")
        if args.kube:
            print(f"export KUBECONFIG={kubeconfig_path(settings)}")
        return 0
    if args.action == "down":
        stopped = slurm_down(settings) if _slurm_running(settings) else []
        stopped += kube_down(settings) if _kube_running(settings) else []
        stopped += monitoring_down(settings)
        for status in [*stack_down(settings), *stopped]:
            print(format_status(status))
        return 0
    everything = [*stack_status(settings), *slurm_status(settings), *kube_status(settings)]
    everything += [status for status in monitoring_status(settings) if status.state != "stopped"]
    for status in everything:
        if args.json:
            print(json.dumps(dataclasses.asdict(status), sort_keys=True))
        else:
            print(format_status(status))
    return status_exit_code(everything)


def status_exit_code(statuses: list[ComponentStatus]) -> int:
    """0: Kafka and Redis run and nothing needs a hand; 1: a stale pid file or another
    process on a stack port (one line says which); 3: the stack is not running (as LSB's
    ``status`` says it), so that ``c4 stack status || c4 stack up`` works."""
    troubled = [status for status in statuses if status.state in ("stale", "foreign")]
    if troubled:
        names = ", ".join(f"{status.name} {status.state}" for status in troubled)
        print(f"c4 stack status: error: {names} (see the detail above)", file=sys.stderr)
        return 1
    core = [status for status in statuses if status.name in ("kafka", "redis")]
    return 0 if all(status.state == "running" for status in core) else 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stack up|down|status [--json]`` subcommand."""
    parser = subparsers.add_parser(
        "stack", help="start, stop or inspect the local Kafka (KRaft) and Redis"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start Kafka and Redis (reuses ours when they already run)")
    up.add_argument(
        "--slurm",
        action="store_true",
        help="also a local Slurm cluster: munged, slurmctld, one slurmd per node (root only)",
    )
    up.add_argument(
        "--kube",
        "--k8s",
        dest="kube",
        action="store_true",
        help="also a Kubernetes API server: etcd and kube-apiserver (prints its KUBECONFIG)",
    )
    up.add_argument(
        "--monitoring",
        action="store_true",
        help="also Prometheus (c4's rules, scraping the workers' ports 9464 and 9465) and"
        " Alertmanager",
    )
    actions.add_parser("down", help="stop the Kafka and Redis that up started")
    status = actions.add_parser(
        "status",
        help="what runs on the stack's ports (exit 0 running, 1 stale or foreign, 3 stopped)",
    )
    status.add_argument("--json", action="store_true", help="one JSON object per component")
    parser.set_defaults(handler=_run, json=False, slurm=False, kube=False, monitoring=False)

"""A node_exporter for tests and demos: Debian's ``prometheus-node-exporter`` (apt-installed
when root and missing), started under our pid file on 127.0.0.1.

It reads a sysfs tree of our choosing (``--path.sysfs``; a fixture tree in the tests) and,
when given, a procfs tree (``--path.procfs``, for ``/proc/net/dev``); only the collectors
named run (default: InfiniBand), without the exporter's own Go and HTTP metrics. Its log and
pid file live in the run folder given; the component's name starts with "prometheus", so
`c4.stack.supervise` knows it as ours by that folder on its command line (the textfile
collector's folder, unused, is put there).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from c4.stack.supervise import (
    HOST,
    Component,
    StackError,
    installed,
    locked,
    our_pid,
    port_answers,
    spawn,
    stop_pid,
    wait_ready,
)

PROGRAM = "prometheus-node-exporter"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
_HINT = f"{PROGRAM} not found: run sudo apt-get install -y {PROGRAM}"


@dataclass(frozen=True, slots=True)
class NodeExporter:
    """A running node_exporter: its component (folder, port) and pid."""

    component: Component
    pid: int

    @property
    def url(self) -> str:
        """Where its metrics are."""
        return f"http://{HOST}:{self.component.port}/metrics"


def node_exporter_component(run_dir: Path, port: int) -> Component:
    """A node_exporter's run folder and web port."""
    return Component(PROGRAM, run_dir, ((port, "--web.listen-address"),))


def node_exporter_binary() -> str:
    """The path of ``prometheus-node-exporter`` (installed first when root and missing)."""
    return installed(PROGRAM, (PROGRAM,), _HINT)


def node_exporter_argv(
    program: str,
    component: Component,
    sysfs: Path,
    procfs: Path | None = None,
    collectors: Sequence[str] = ("infiniband",),
) -> list[str]:
    """The command line: listen on 127.0.0.1, read ``sysfs`` (and ``procfs``), run only
    ``collectors``."""
    argv = [
        program,
        f"--web.listen-address={HOST}:{component.port}",
        f"--path.sysfs={sysfs.resolve()}",
        "--collector.disable-defaults",
        "--web.disable-exporter-metrics",
        # Unused (the textfile collector is off), but puts our folder on the command line.
        f"--collector.textfile.directory={component.run_dir.resolve()}/textfile",
        *(f"--collector.{name}" for name in collectors),
    ]
    if procfs is not None:
        argv.append(f"--path.procfs={procfs.resolve()}")
        if "netdev" in collectors:
            argv.append(
                "--no-collector.netdev.netlink"
            )  # /proc/net/dev of procfs, not the kernel's
    return argv


def _metrics_probe(component: Component) -> Callable[[float], bool]:
    url = f"http://{HOST}:{component.port}/metrics"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def probe(timeout_s: float) -> bool:
        try:
            with opener.open(url, timeout=timeout_s) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    return probe


def start_node_exporter(
    component: Component,
    sysfs: Path,
    procfs: Path | None = None,
    collectors: Sequence[str] = ("infiniband",),
    timeout_s: float = READY_TIMEOUT_S,
) -> NodeExporter:
    """Start a node_exporter for ``component`` (or find the one already running there) and
    wait until it serves its metrics; StackError, naming the log, when it does not."""
    if not sysfs.is_dir():
        message = f"node_exporter: sysfs tree {sysfs} is not a folder"
        raise StackError(message)
    program = node_exporter_binary()
    component.run_dir.mkdir(parents=True, exist_ok=True)
    with locked(component.lock_file):
        pid = our_pid(component)
        if pid is None:
            if port_answers(component.port):
                message = f"node_exporter: port {component.port} on {HOST} is taken"
                raise StackError(message)
            argv = node_exporter_argv(program, component, sysfs, procfs, collectors)
            pid = spawn(argv, component.log_file, component.pid_file)
        try:
            wait_ready(component, pid, _metrics_probe(component), timeout_s)
        except StackError:
            stop_pid(component, pid, STOP_TIMEOUT_S)
            raise
    return NodeExporter(component, pid)


def stop_node_exporter(component: Component) -> bool:
    """Stop the node_exporter we started for ``component``; whether one was running."""
    with locked(component.lock_file):
        pid = our_pid(component)
        if pid is None:
            component.pid_file.unlink(missing_ok=True)
            return False
        stop_pid(component, pid, STOP_TIMEOUT_S)
        return True

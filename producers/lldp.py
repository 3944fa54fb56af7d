"""The node's LLDP neighbours, as v1 ``neighbours`` messages (``c4 agent --lldp``).

lldpd runs on the node (it does on most RoCE and Ethernet clusters); each round asks it with
``lldpcli -f json show neighbors`` and reports, per port, the switch and switch port at the
other end. A RoCE interface is reported as its RDMA port, the id the topology and the link
messages use: sysfs names the interface of each RDMA port
(``class/infiniband/<device>/ports/<n>/gid_attrs/ndevs/0``). Other interfaces keep their
names, as the sysfs source reports them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from producers.sources import Reading, SourceFailed, SourceUnavailable
from schemas.messages import MAX_NODE_PORTS, NeighbourPort, Neighbours
from topology import TopologyError
from topology.lldp import parse_neighbours

LLDPCLI_TIMEOUT_S = 10.0
MAX_OUTPUT_CHARS = 16 * 1024 * 1024


def rdma_ports_by_interface(root: Path) -> dict[str, str]:
    """``{interface: "<device>:<port>"}`` for every RDMA port sysfs ties to an interface."""
    found: dict[str, str] = {}
    ib = root / "class" / "infiniband"
    for ndev in sorted(ib.glob("*/ports/*/gid_attrs/ndevs/0")) if ib.is_dir() else []:
        try:
            interface = ndev.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue  # a GID entry without a netdev reads as an error on some kernels
        port_dir = ndev.parents[2]
        if interface:
            found.setdefault(interface, f"{port_dir.parents[1].name}:{port_dir.name}")
    return found


class LldpSource:
    """One ``neighbours`` message a round: what lldpd sees on each of the node's ports."""

    def __init__(
        self,
        node: str,
        interval_s: float = 60.0,
        sysfs_root: Path = Path("/sys"),
        socket: str | None = None,
        lldpcli: str = "lldpcli",
    ) -> None:
        self.name = "lldp"
        self.interval_s = interval_s
        self.node, self._sysfs = node, sysfs_root
        program = shutil.which(lldpcli)
        if program is None:
            message = f"{lldpcli} not found: install lldpd (apt-get install -y lldpd)"
            raise SourceUnavailable(message)
        self._argv = [
            program,
            *(("-u", socket) if socket else ()),
            "-f",
            "json",
            "show",
            "neighbors",
        ]

    def read(self, now_ns: int) -> Reading:
        """The neighbours lldpd knows now; SourceFailed when lldpcli cannot tell."""
        try:
            result = subprocess.run(  # noqa: S603 - argv built here, no shell
                self._argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=LLDPCLI_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            message = f"lldpcli: {error}"
            raise SourceFailed(message) from None
        if result.returncode != 0:
            lines = result.stderr.strip().splitlines() or [f"exit {result.returncode}"]
            message = f"lldpcli: {lines[-1]}"
            raise SourceFailed(message)
        if len(result.stdout) > MAX_OUTPUT_CHARS:
            message = f"lldpcli: more than {MAX_OUTPUT_CHARS} characters of output"
            raise SourceFailed(message)
        try:
            found = parse_neighbours(result.stdout, "lldpcli")
        except TopologyError as error:
            raise SourceFailed(str(error)) from None
        rdma = rdma_ports_by_interface(self._sysfs)
        ports: dict[str, NeighbourPort] = {}
        problems = []
        for neighbour in found:
            port = rdma.get(neighbour.interface, neighbour.interface)
            if port in ports:
                problems.append(f"lldp: {port} has more than one neighbour; the first kept")
                continue
            ports[port] = NeighbourPort(
                port=port, switch=neighbour.chassis, switch_port=neighbour.port
            )
        report = Neighbours(
            v=1,
            kind="neighbours",
            node=self.node,
            ts_ns=now_ns,
            ports=tuple(ports.values())[:MAX_NODE_PORTS],
        )
        return Reading([report], problems)

    def close(self) -> None:
        """Nothing is held open."""

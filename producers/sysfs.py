"""RDMA and Ethernet port counters from sysfs, as v1 link messages.

Units are the kernel's (Documentation/ABI/stable/sysfs-class-infiniband):
``port_xmit_data`` and ``port_rcv_data`` count octets divided by 4, so they are multiplied
by 4 here; the other counters are packets or events. Counters are sent cumulative, as the
NIC reports them (the contract's readers compute rates and take a decrease as a reset);
`counter_rates` is that computation, used for the agent's own report. Every file is read on
its own: a missing or garbled file is one problem line naming it, the other files and ports
are still read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from producers.sources import Reading, SourceFailed
from schemas.messages import Link, LinkCounters

NS_PER_S = 1_000_000_000
MAX_COUNTER = 2**63 - 1  # what a v1 message can carry

# sysfs counter file -> (LinkCounters field, multiplier)
IB_COUNTERS: dict[str, tuple[str, int]] = {
    "port_xmit_data": ("tx_bytes", 4),
    "port_rcv_data": ("rx_bytes", 4),
    "port_xmit_packets": ("tx_pkts", 1),
    "port_rcv_packets": ("rx_pkts", 1),
    "port_xmit_wait": ("tx_wait", 1),
    "symbol_error": ("symbol_err", 1),
    "link_downed": ("link_down", 1),
    "port_rcv_errors": ("rx_err", 1),
}
IB_HW_COUNTERS: dict[str, tuple[str, int]] = {
    "out_of_sequence": ("out_of_seq", 1),
    "np_cnp_sent": ("cnp_sent", 1),
    "rp_cnp_handled": ("cnp_handled", 1),
    "local_ack_timeout_err": ("timeout_retrans", 1),
}
# Files every IB port has; the others are optional (hw_counters differ between NICs).
IB_REQUIRED = frozenset({"port_xmit_data", "port_rcv_data"})
NET_COUNTERS: dict[str, tuple[str, int]] = {
    "tx_bytes": ("tx_bytes", 1),
    "rx_bytes": ("rx_bytes", 1),
    "tx_packets": ("tx_pkts", 1),
    "rx_packets": ("rx_pkts", 1),
    "rx_errors": ("rx_err", 1),
}
NET_REQUIRED = frozenset({"tx_bytes", "rx_bytes"})
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


class _BadFile(Exception):
    """One sysfs file is missing or unreadable (the message names it)."""


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        message = f"{path}: missing"
        raise _BadFile(message) from None
    except OSError as error:
        message = f"{path}: cannot read ({error.strerror or error})"
        raise _BadFile(message) from None


def _read_counter(path: Path, factor: int = 1) -> int:
    text = _read_text(path)
    # isascii: str.isdigit also accepts superscripts and other scripts' digits.
    if not (text.isascii() and text.isdigit()):
        message = f"{path}: not a counter: {text[:40]!r}"
        raise _BadFile(message)
    value = int(text[:40]) * factor
    if value > MAX_COUNTER:
        message = f"{path}: counter beyond 64 bits: {text[:40]!r}"
        raise _BadFile(message)
    return value


@dataclass(frozen=True, slots=True)
class PortFiles:
    """Where one port's facts are: its id, counter folders and state/speed files."""

    port: str
    counters: tuple[tuple[Path, dict[str, tuple[str, int]], frozenset[str]], ...]
    state: Path
    speed: Path
    ethernet: bool


def discover(root: Path, net_interfaces: frozenset[str] | None = None) -> list[PortFiles]:
    """Every InfiniBand/RoCE port and every physical network interface under ``root``."""
    ports: list[PortFiles] = []
    ib = root / "class" / "infiniband"
    for device in sorted(ib.iterdir()) if ib.is_dir() else []:
        for port_dir in sorted((device / "ports").glob("*")):
            ports.append(
                PortFiles(
                    port=f"{device.name}:{port_dir.name}",
                    counters=(
                        (port_dir / "counters", IB_COUNTERS, IB_REQUIRED),
                        (port_dir / "hw_counters", IB_HW_COUNTERS, frozenset()),
                    ),
                    state=port_dir / "state",
                    speed=port_dir / "rate",
                    ethernet=False,
                )
            )
    net = root / "class" / "net"
    for interface in sorted(net.iterdir()) if net.is_dir() else []:
        wanted = (
            interface.name in net_interfaces
            if net_interfaces is not None
            else interface.name != "lo" and (interface / "device").exists()
        )
        if wanted:
            ports.append(
                PortFiles(
                    port=interface.name,
                    counters=((interface / "statistics", NET_COUNTERS, NET_REQUIRED),),
                    state=interface / "operstate",
                    speed=interface / "speed",
                    ethernet=True,
                )
            )
    return ports


def read_port(node: str, files: PortFiles, ts_ns: int) -> tuple[Link | None, list[str]]:
    """One port's link message (None when its state is unreadable) and its problem lines."""
    problems: list[str] = []
    values: dict[str, int] = {}
    for folder, names, required in files.counters:
        for name, (field_name, factor) in names.items():
            path = folder / name
            if name not in required and not path.exists():
                continue
            try:
                values[field_name] = _read_counter(path, factor)
            except _BadFile as error:
                problems.append(str(error))
    try:
        state_text = _read_text(files.state)
    except _BadFile as error:
        return None, [*problems, str(error)]
    up = state_text.lower() == "up" if files.ethernet else state_text.endswith("ACTIVE")
    gbps: float | None = None
    try:
        speed_text = _read_text(files.speed)
        if files.ethernet:
            mbps = int(speed_text)
            gbps = mbps / 1000 if mbps > 0 else None
        else:
            match = _RATE.match(speed_text)
            if match is None:
                message = f"{files.speed}: not a rate: {speed_text[:40]!r}"
                raise _BadFile(message)
            gbps = float(match.group(1))
    except _BadFile as error:
        problems.append(str(error))
    except ValueError:
        problems.append(f"{files.speed}: not a speed in Mb/s")
    link = Link(
        v=1,
        kind="link",
        node=node,
        port=files.port,
        ts_ns=ts_ns,
        state="up" if up else "down",
        gbps=gbps,
        counters=LinkCounters(**values),
    )
    return link, problems


def counter_rates(before: Link, after: Link) -> dict[str, float]:
    """Per-second rate of each counter present in both; a decrease is a reset to zero."""
    seconds = (after.ts_ns - before.ts_ns) / NS_PER_S
    if seconds <= 0:
        return {}
    rates: dict[str, float] = {}
    old, new = before.counters.model_dump(), after.counters.model_dump()
    for name, value in new.items():
        if value is None or old.get(name) is None:
            continue
        delta = value - old[name] if value >= old[name] else value
        rates[name] = delta / seconds
    return rates


class SysfsSource:
    """Link messages for every port under a sysfs root (``/sys`` on a real node)."""

    def __init__(
        self,
        node: str,
        root: Path = Path("/sys"),
        interval_s: float = 1.0,
        net_interfaces: frozenset[str] | None = None,
    ) -> None:
        self.name = "sysfs"
        self.interval_s = interval_s
        self.node, self.root, self._net = node, root, net_interfaces
        self.last: dict[str, Link] = {}
        self.rates: dict[str, dict[str, float]] = {}

    def read(self, now_ns: int) -> Reading:
        """One link message per port; rates against the previous reading kept in ``rates``."""
        if not self.root.is_dir():
            message = f"sysfs root {self.root} is not a folder"
            raise SourceFailed(message)
        reading = Reading()
        for files in discover(self.root, self._net):
            link, problems = read_port(self.node, files, now_ns)
            reading.problems.extend(problems)
            if link is None:
                continue
            previous = self.last.get(link.port)
            if previous is not None:
                self.rates[link.port] = counter_rates(previous, link)
            self.last[link.port] = link
            reading.messages.append(link)
        return reading

    def close(self) -> None:
        """Nothing is held open."""

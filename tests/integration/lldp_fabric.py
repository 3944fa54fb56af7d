"""A small Ethernet fabric of network namespaces joined by veth pairs, each namespace running
Debian's lldpd under its own name: nodes, leaves and a spine that see each other over LLDP.
Loopback scope only: nothing leaves the machine. Everything made is removed on close."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from c4.stack.supervise import installed
from topology.lldp import parse_neighbours

LLDPD_READY_S = 90.0


def _ip(*args: str) -> None:
    ip = installed("ip", ("iproute2",), "apt-get install -y iproute2")
    subprocess.run([ip, *args], check=True, capture_output=True, timeout=30)  # noqa: S603


@dataclass
class LldpFabric:
    """Namespaces by system name; lldpd's socket for each; the cables made so far."""

    folder: Path
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    sockets: dict[str, Path] = field(default_factory=dict)
    _namespaces: dict[str, str] = field(default_factory=dict)
    _daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _cables: int = 0

    def __post_init__(self) -> None:
        self.lldpd = installed("lldpd", ("lldpd",), "apt-get install -y lldpd")
        self.lldpcli = installed("lldpcli", ("lldpd",), "apt-get install -y lldpd")
        # lldpd configures itself through its socket as its unprivileged user (_lldpd), who
        # cannot reach pytest's private temporary folders: sockets and configs go here.
        self.run_dir = Path(tempfile.mkdtemp(prefix="c4-lldp-"))
        self.run_dir.chmod(0o755)

    def system(self, name: str) -> None:
        """A namespace for the system ``name`` (its loopback up)."""
        namespace = f"c4t{self.token}-{len(self._namespaces)}"
        _ip("netns", "add", namespace)
        self._namespaces[name] = namespace
        _ip("-n", namespace, "link", "set", "lo", "up")

    def cable(self, a: str, a_port: str, b: str, b_port: str) -> None:
        """A veth pair from ``a``'s ``a_port`` to ``b``'s ``b_port``, both ends up."""
        self._cables += 1
        left, right = f"c4v{self.token}a{self._cables}", f"c4v{self.token}b{self._cables}"
        _ip("link", "add", left, "type", "veth", "peer", "name", right)
        for end, system, port in ((left, a, a_port), (right, b, b_port)):
            namespace = self._namespaces[system]
            _ip("link", "set", end, "netns", namespace)
            _ip("-n", namespace, "link", "set", end, "name", port)
            _ip("-n", namespace, "link", "set", port, "up")

    def unplug(self, system: str, port: str) -> None:
        """Remove the cable at ``system``'s ``port`` (both ends of the veth go)."""
        _ip("-n", self._namespaces[system], "link", "del", port)

    def start(self, switches: set[str]) -> None:
        """lldpd in every namespace, sending each second; switches send their port names as
        port ids and say they bridge and route, as switch operating systems do."""
        for name, namespace in self._namespaces.items():
            config = self.run_dir / f"{name}.lldpd.conf"
            lines = [f"configure system hostname {name}", "configure lldp tx-interval 1"]
            if name in switches:
                lines.append("configure lldp portidsubtype ifname")
                lines.append("configure system capabilities enabled bridge,router")
            config.write_text("\n".join(lines) + "\n")
            socket = self.run_dir / f"{name}.sock"
            self.sockets[name] = socket
            log = (self.folder / f"{name}.lldpd.log").open("wb")
            ip = installed("ip", ("iproute2",), "apt-get install -y iproute2")
            argv = [ip, "netns", "exec", namespace, self.lldpd, "-d", "-u", str(socket)]
            argv += ["-O", str(config), "-L", self.lldpcli]
            self._daemons.append(
                subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
            )
            log.close()

    def neighbours(self, system: str) -> str:
        """``lldpcli -f json show neighbors`` of one system, as lldpcli prints it."""
        result = subprocess.run(  # noqa: S603 - fixed argv
            [self.lldpcli, "-u", str(self.sockets[system]), "-f", "json", "show", "neighbors"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return result.stdout

    def wait_for(self, system: str, expected: set[tuple[str, str]]) -> str:
        """The system's neighbours once they are exactly ``expected`` (local port, chassis)."""
        deadline = time.monotonic() + LLDPD_READY_S
        while True:
            for daemon in self._daemons:
                assert daemon.poll() is None, f"an lldpd exited: see {self.folder}/*.lldpd.log"
            try:
                text = self.neighbours(system)
                seen = {(n.interface, n.chassis) for n in parse_neighbours(text, system)}
            except subprocess.CalledProcessError:
                seen = set()  # lldpd still starting: its socket not there yet
            if seen == expected:
                return text
            assert time.monotonic() < deadline, f"{system} sees {seen}, not {expected}"
            time.sleep(0.5)

    def close(self) -> None:
        """Stop every lldpd and remove every namespace (and with them the veths)."""
        for daemon in self._daemons:
            daemon.terminate()
        for daemon in self._daemons:
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=15)
        for namespace in self._namespaces.values():
            subprocess.run(["ip", "netns", "del", namespace], check=False, timeout=30)  # noqa: S607
        shutil.rmtree(self.run_dir, ignore_errors=True)

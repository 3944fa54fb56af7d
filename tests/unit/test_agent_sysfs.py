"""sysfs counters: fixture trees that move, reset, and hold missing or garbage files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from producers.agent import Agent
from producers.sysfs import SysfsSource, counter_rates
from schemas.base import C4Model
from schemas.codec import decode
from schemas.messages import Link

S = 1_000_000_000
T0 = 1_800_000_000_000_000_000


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def ib_port(
    root: Path, device: str, port: int, counters: dict[str, int], state: str = "4: ACTIVE"
) -> None:
    base = root / "class" / "infiniband" / device / "ports" / str(port)
    for name, value in counters.items():
        folder = "hw_counters" if name in {"out_of_sequence", "np_cnp_sent"} else "counters"
        _write(base / folder / name, str(value))
    _write(base / "state", state)
    _write(base / "rate", "200 Gb/sec (2X NDR)")


def net_if(root: Path, name: str, counters: dict[str, int], physical: bool = True) -> None:
    base = root / "class" / "net" / name
    for key, value in counters.items():
        _write(base / "statistics" / key, str(value))
    _write(base / "operstate", "up")
    _write(base / "speed", "100000")
    if physical:
        (base / "device").mkdir(parents=True, exist_ok=True)


def read(source: SysfsSource, ts_ns: int) -> tuple[dict[str, Link], list[str]]:
    reading = source.read(ts_ns)
    links = {m.port: m for m in reading.messages if isinstance(m, Link)}
    return links, reading.problems


def test_counters_in_kernel_units_and_rates_over_a_moving_tree(tmp_path: Path) -> None:
    ib_port(
        tmp_path,
        "mlx5_0",
        1,
        {
            "port_xmit_data": 1000,
            "port_rcv_data": 500,
            "port_xmit_packets": 10,
            "symbol_error": 0,
            "out_of_sequence": 3,
            "np_cnp_sent": 1,
        },
    )
    net_if(
        tmp_path,
        "eth0",
        {"tx_bytes": 100, "rx_bytes": 200, "tx_packets": 1, "rx_packets": 2, "rx_errors": 0},
    )
    net_if(tmp_path, "veth9", {"tx_bytes": 1, "rx_bytes": 1}, physical=False)
    source = SysfsSource("node-001", tmp_path)

    links, problems = read(source, T0)
    assert problems == []
    assert set(links) == {"mlx5_0:1", "eth0"}  # virtual interfaces are left out
    port = links["mlx5_0:1"]
    assert port.state == "up" and port.gbps == 200
    assert port.counters.tx_bytes == 4000 and port.counters.rx_bytes == 2000  # octets / 4
    assert port.counters.tx_pkts == 10 and port.counters.out_of_seq == 3
    assert port.counters.cnp_sent == 1
    assert links["eth0"].gbps == 100 and links["eth0"].counters.rx_bytes == 200

    ib_port(
        tmp_path,
        "mlx5_0",
        1,
        {
            "port_xmit_data": 251_000,
            "port_rcv_data": 500,
            "port_xmit_packets": 110,
            "symbol_error": 4,
            "out_of_sequence": 3,
            "np_cnp_sent": 1,
        },
    )
    links, problems = read(source, T0 + 2 * S)
    assert problems == []
    rates = source.rates["mlx5_0:1"]
    assert rates["tx_bytes"] == (251_000 - 1000) * 4 / 2
    assert rates["tx_pkts"] == 50 and rates["symbol_err"] == 2 and rates["rx_bytes"] == 0

    # The NIC reset its counters (driver reload): the new values count from zero.
    ib_port(
        tmp_path,
        "mlx5_0",
        1,
        {
            "port_xmit_data": 100,
            "port_rcv_data": 40,
            "port_xmit_packets": 6,
            "symbol_error": 0,
            "out_of_sequence": 0,
            "np_cnp_sent": 0,
        },
    )
    links, _ = read(source, T0 + 4 * S)
    rates = source.rates["mlx5_0:1"]
    assert rates["tx_bytes"] == 100 * 4 / 2 and rates["tx_pkts"] == 3
    assert all(rate >= 0 for rate in rates.values())
    assert links["mlx5_0:1"].counters.tx_bytes == 400  # sent as the NIC reports it


def test_missing_and_garbage_files_are_per_file_problems(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, {"port_xmit_data": 10, "port_rcv_data": 10, "symbol_error": 1})
    ib_port(tmp_path, "mlx5_1", 1, {"port_xmit_data": 10, "port_rcv_data": 10}, state="1: DOWN")
    ib_port(tmp_path, "mlx5_2", 1, {"port_xmit_data": 10, "port_rcv_data": 10})
    counters = tmp_path / "class/infiniband/mlx5_0/ports/1/counters"
    (counters / "port_rcv_data").unlink()
    (counters / "symbol_error").write_text("lots\n")
    (tmp_path / "class/infiniband/mlx5_2/ports/1/state").unlink()
    (tmp_path / "class/infiniband/mlx5_1/ports/1/rate").write_text("fast\n")

    links, problems = read(SysfsSource("node-001", tmp_path), T0)
    assert sorted(problems) == sorted(
        [
            f"{counters}/port_rcv_data: missing",
            f"{counters}/symbol_error: not a counter: 'lots'",
            f"{tmp_path}/class/infiniband/mlx5_1/ports/1/rate: not a rate: 'fast'",
            f"{tmp_path}/class/infiniband/mlx5_2/ports/1/state: missing",
        ]
    )
    # mlx5_0 still reports what it could read; mlx5_1 is down without a speed.
    assert links["mlx5_0:1"].counters.tx_bytes == 40
    assert links["mlx5_0:1"].counters.rx_bytes is None
    assert links["mlx5_0:1"].counters.symbol_err is None
    assert links["mlx5_1:1"].state == "down" and links["mlx5_1:1"].gbps is None
    assert "mlx5_2:1" not in links  # no state, no message


def test_counter_rates_need_time_to_pass() -> None:
    link = Link(
        v=1, kind="link", node="n", port="p", ts_ns=T0, state="up", counters={"tx_bytes": 5}
    )
    assert counter_rates(link, link) == {}


def test_agent_reports_each_problem_once_and_goes_on(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, {"port_xmit_data": "x", "port_rcv_data": 1})  # type: ignore[dict-item]
    sent: list[C4Model] = []
    reports: list[str] = []
    agent = Agent([SysfsSource("node-001", tmp_path)], sent.append, reports.append)
    agent.run_once()
    agent.run_once()
    assert len(sent) == 2
    assert reports == [
        f"source sysfs: {tmp_path}/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data:"
        " not a counter: 'x'"
    ]


def test_agent_once_print_reads_a_sysfs_tree(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_3", 1, {"port_xmit_data": 7, "port_rcv_data": 9})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "c4.cli",
            "agent",
            "--once",
            "--print",
            "--no-nvml",
            "--node",
            "node-009",
            "--sysfs-root",
            str(tmp_path),
        ],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    link = decode(line)
    assert isinstance(link, Link)
    assert (link.node, link.port, link.counters.tx_bytes) == ("node-009", "mlx5_3:1", 28)
    assert b"1 messages from sysfs" in result.stderr


def test_a_missing_root_fails_the_round_and_the_agent_says_so_once(tmp_path: Path) -> None:
    reports: list[str] = []
    source = SysfsSource("n", tmp_path / "nowhere")
    agent = Agent([source], lambda m: None, reports.append)
    agent.run_once()
    agent.run_once()
    assert reports == [
        f"source sysfs: failed (SourceFailed: sysfs root {tmp_path}/nowhere is not a folder)"
    ]
    (tmp_path / "nowhere").mkdir()
    agent.run_once()
    assert reports[-1] == "source sysfs: recovered"
    assert SysfsSource("n", tmp_path).read(T0).messages == []

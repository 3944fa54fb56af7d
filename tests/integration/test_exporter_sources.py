"""``c4 agent`` reading real exporters: Debian's prometheus-node-exporter over the fixture
sysfs tree gives the link messages the sysfs source gives for that tree, and a recorded
dcgm-exporter answer served over HTTP gives the gpu messages it holds."""

from __future__ import annotations

import http.server
import json
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from c4.stack.node_exporter import (
    NodeExporter,
    node_exporter_component,
    start_node_exporter,
    stop_node_exporter,
)
from c4.stack.supervise import (
    Component,
    StackError,
    alive,
    installed,
    our_pid,
    send_signal,
    spawn,
    wait_gone,
    wait_ready,
)

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SYSFS_TREE = FIXTURES / "sysfs" / "gpu-node"
PROCFS_TREE = FIXTURES / "procfs" / "gpu-node"
DCGM_TEXT = (FIXTURES / "exporters" / "dcgm-exporter.txt").read_bytes()
HW_ONLY = {"out_of_seq", "cnp_sent", "cnp_handled", "timeout_retrans"}  # not in node_exporter
NODE = "node-017"
HOSTNAME = "gpu-node-017"  # the Hostname label of the recorded dcgm-exporter answer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeExporter]:
    """prometheus-node-exporter (installed when missing) on a free port, reading the fixture
    trees with its InfiniBand, netclass and netdev collectors; stopped at the end."""
    component = node_exporter_component(tmp_path_factory.mktemp("node-exporter"), free_port())
    try:
        started = start_node_exporter(
            component, SYSFS_TREE, PROCFS_TREE, ("infiniband", "netclass", "netdev")
        )
    except StackError as error:
        pytest.fail(f"node_exporter did not start: {error}")
    try:
        yield started
    finally:
        assert stop_node_exporter(component)
        assert not alive(started.pid)


class _Dcgm(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(DCGM_TEXT)))
        self.end_headers()
        self.wfile.write(DCGM_TEXT)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet."""


@pytest.fixture(scope="module")
def dcgm_url() -> Iterator[str]:
    """The recorded dcgm-exporter answer, served on 127.0.0.1 as dcgm-exporter serves it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dcgm)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def agent_once(*argv: str, node: str = NODE) -> tuple[list[dict[str, Any]], str]:
    """``c4 agent --once --print``: its messages (without ts_ns) and its stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "c4.cli", "agent", "--once", "--print", "--node", node, *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line) for line in result.stdout.splitlines()]
    for message in messages:
        assert message.pop("ts_ns") > 0
    return messages, result.stderr


def test_node_exporter_gives_the_link_messages_sysfs_gives(node_exporter: NodeExporter) -> None:
    from_exporter, report = agent_once(
        "--no-nvml", "--node-exporter-url", node_exporter.url, "--net-if", "eth0"
    )
    from_sysfs, _ = agent_once("--no-nvml", "--sysfs-root", str(SYSFS_TREE), "--net-if", "eth0")
    assert "4 messages from node-exporter" in report
    assert [m["port"] for m in from_exporter] == ["eth0", "mlx5_0:1", "mlx5_0:2", "mlx5_1:1"]
    assert sorted(m["port"] for m in from_sysfs) == [m["port"] for m in from_exporter]
    exporter_by_port = {m["port"]: m for m in from_exporter}
    for expected in from_sysfs:
        # node_exporter does not read mlx5's hw_counters; everything else is equal.
        for name in HW_ONLY & set(expected["counters"]):
            del expected["counters"][name]
        assert exporter_by_port[expected["port"]] == expected
    assert exporter_by_port["mlx5_0:1"]["counters"]["tx_bytes"] == 4 * 2207698522321
    assert exporter_by_port["mlx5_1:1"]["counters"]["tx_bytes"] == 4 * 1125899906842623


def test_dcgm_exporter_output_gives_gpu_messages(dcgm_url: str) -> None:
    messages, report = agent_once("--no-sysfs", "--dcgm-url", dcgm_url)
    assert "4 messages from dcgm-exporter" in report
    assert "node-017/gpu3: row remapping failed (DCGM_FI_DEV_ROW_REMAP_FAILURE = 1)" in report
    base = {"v": 1, "kind": "gpu", "node": NODE}
    assert messages == [
        {**base, "gpu": 0, "xid": [], "temp_c": 67.0, "power_w": 612.456, "sm_mhz": 1980.0,
         "ecc_dbe": 0, "retired_pages": 0, "throttle": [], "nvlink_err": 0},
        {**base, "gpu": 1, "xid": [48], "temp_c": 64.0, "power_w": 598.103, "sm_mhz": 1980.0,
         "ecc_dbe": 2, "retired_pages": 1, "throttle": [], "nvlink_err": 0},
        {**base, "gpu": 2, "xid": [], "temp_c": 91.0, "power_w": 700.0, "sm_mhz": 1035.0,
         "ecc_dbe": 0, "retired_pages": 0,
         "throttle": ["sw_power_cap", "hw_slowdown", "hw_thermal"], "nvlink_err": 16},
        {**base, "gpu": 3, "xid": [13], "temp_c": 58.0, "power_w": 95.25, "sm_mhz": 345.0,
         "ecc_dbe": 0, "retired_pages": 3, "throttle": [], "nvlink_err": 0},
    ]  # fmt: skip


def test_both_exporters_at_once_and_an_unreachable_one(
    node_exporter: NodeExporter, dcgm_url: str
) -> None:
    messages, report = agent_once("--dcgm-url", dcgm_url, "--node-exporter-url", node_exporter.url)
    assert [m["kind"] for m in messages] == ["link"] * 3 + ["gpu"] * 4
    assert "7 messages from node-exporter, dcgm-exporter" in report
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    messages, report = agent_once("--dcgm-url", dead, "--node-exporter-url", node_exporter.url)
    assert [m["kind"] for m in messages] == ["link"] * 3
    assert (
        f"source dcgm-exporter: failed (SourceFailed: {dead}: [Errno 111] Connection refused)"
        in report
    )


# --- through a real Prometheus -----------------------------------------------------------------


def _query(base: str, expression: str, timeout_s: float) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 -- ours
        result: list[dict[str, Any]] = json.load(response)["data"]["result"]
        return result


def _scraped(base: str) -> Any:
    """A readiness probe: both exporters' series are in Prometheus."""

    def probe(timeout_s: float) -> bool:
        try:
            ports = _query(base, "count(node_infiniband_state_id)", timeout_s)
            gpus = _query(base, "count(DCGM_FI_DEV_GPU_TEMP)", timeout_s)
        except (urllib.error.URLError, OSError, KeyError, ValueError):
            return False
        return bool(ports and gpus) and ports[0]["value"][1] == "3" and gpus[0]["value"][1] == "4"

    return probe


@pytest.fixture(scope="module")
def prometheus_url(
    tmp_path_factory: pytest.TempPathFactory, node_exporter: NodeExporter, dcgm_url: str
) -> Iterator[str]:
    """Debian's Prometheus (installed when missing) scraping both exporters every second,
    node_exporter's instance relabelled to the node's host name as clusters do; stopped at
    the end."""
    program = installed("prometheus", ("prometheus",), "apt-get install -y prometheus")
    run_dir = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    component = Component("prometheus-exporter-test", run_dir, ((port, "--web.listen-address"),))
    dcgm_target = urllib.parse.urlsplit(dcgm_url).netloc
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "node",
                "static_configs": [{"targets": [f"127.0.0.1:{node_exporter.component.port}"]}],
                "relabel_configs": [
                    {"target_label": "instance", "replacement": f"{HOSTNAME}:9100"}
                ],
            },
            {"job_name": "dcgm", "static_configs": [{"targets": [dcgm_target]}]},
        ],
    }
    (run_dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    argv = [
        program,
        f"--config.file={run_dir}/prometheus.yml",
        f"--storage.tsdb.path={run_dir}/data",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    pid = spawn(argv, component.log_file, component.pid_file)
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(component, pid, _scraped(base), 60.0)
        except StackError as error:
            pytest.fail(f"Prometheus did not scrape the exporters: {error}")
        yield base
    finally:
        assert our_pid(component) == pid
        send_signal(component, pid, signal.SIGTERM)
        if not wait_gone(pid, 20.0):
            send_signal(component, pid, signal.SIGKILL)
            wait_gone(pid, 10.0)


def _renamed(messages: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [{**message, "node": node} for message in messages]


def test_through_prometheus_the_same_messages_as_from_the_exporters(
    prometheus_url: str, node_exporter: NodeExporter, dcgm_url: str
) -> None:
    direct, _ = agent_once("--dcgm-url", dcgm_url, "--node-exporter-url", node_exporter.url)
    this_node, report = agent_once("--prometheus-url", prometheus_url)
    assert "0 messages from prometheus-link, prometheus-gpu" in report  # NODE has no series
    this_node, report = agent_once("--prometheus-url", prometheus_url, node=HOSTNAME)
    assert "7 messages from prometheus-link, prometheus-gpu" in report
    assert this_node == _renamed(direct, HOSTNAME)
    # One collector per cluster: every node's messages, named by the series.
    everyone, _ = agent_once("--prometheus-url", prometheus_url, "--prometheus-all-nodes")
    assert everyone == _renamed(direct, HOSTNAME)

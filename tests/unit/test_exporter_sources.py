"""dcgm-exporter, node_exporter and Prometheus -> v1 gpu and link messages, in the units of
the NVML and sysfs sources: recorded exporter output, the fixture sysfs tree it was recorded
from, broken input, and the agent's options."""

from __future__ import annotations

import argparse
import http.server
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from c4.agent_cmd import AgentOptionError, build_sources, register
from c4.cli import main
from producers.agent import Agent
from producers.exporters import (
    DEFAULT_DCGM_URL,
    DcgmExporterSource,
    NodeExporterSource,
    PrometheusGpuSource,
    PrometheusLinkSource,
    check_url,
    http_get,
)
from producers.sources import SourceFailed
from producers.sysfs import SysfsSource
from schemas.base import C4Model
from schemas.messages import Gpu, Link

T0 = 1_800_000_000_000_000_000
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DCGM_TEXT = (FIXTURES / "exporters" / "dcgm-exporter.txt").read_text()
NODE_EXPORTER_TEXT = (FIXTURES / "exporters" / "node-exporter.txt").read_text()
SYSFS_TREE = FIXTURES / "sysfs" / "gpu-node"
# mlx5's hw_counters: sysfs has them, node_exporter does not read them.
HW_ONLY = {"out_of_seq", "cnp_sent", "cnp_handled", "timeout_retrans"}
TEXT = "text/plain; version=0.0.4; charset=utf-8"


def serving(text: str, content_type: str = TEXT) -> Callable[[str, float], tuple[str, str]]:
    """A fetch that answers every URL with ``text``."""

    def fetch(url: str, timeout_s: float) -> tuple[str, str]:
        return text, content_type

    return fetch


def gpu(index: int, xid: tuple[int, ...] = (), node: str = "node-017", **fields: object) -> Gpu:
    return Gpu.model_validate(
        {"v": 1, "kind": "gpu", "node": node, "gpu": index, "ts_ns": T0, "xid": xid, **fields}
    )


EXPECTED_GPUS = [
    gpu(
        0,
        temp_c=67.0,
        power_w=612.456,
        sm_mhz=1980.0,
        ecc_dbe=0,
        retired_pages=0,
        throttle=(),
        nvlink_err=0,
    ),
    gpu(
        1,
        (48,),
        temp_c=64.0,
        power_w=598.103,
        sm_mhz=1980.0,
        ecc_dbe=2,
        retired_pages=1,
        throttle=(),
        nvlink_err=0,
    ),
    gpu(
        2,
        temp_c=91.0,
        power_w=700.0,
        sm_mhz=1035.0,
        ecc_dbe=0,
        retired_pages=0,
        throttle=("sw_power_cap", "hw_slowdown", "hw_thermal"),
        nvlink_err=16,
    ),
    gpu(
        3,
        (13,),
        temp_c=58.0,
        power_w=95.25,
        sm_mhz=345.0,
        ecc_dbe=0,
        retired_pages=3,
        throttle=(),
        nvlink_err=0,
    ),
]


# --- dcgm-exporter ---------------------------------------------------------------------------


def test_recorded_dcgm_exporter_output_gives_one_gpu_message_per_gpu() -> None:
    source = DcgmExporterSource("node-017", fetch=serving(DCGM_TEXT))
    reading = source.read(T0)
    assert reading.messages == EXPECTED_GPUS
    # GPU 3's row remapping failed: no field for it in v1, so it is said as a problem.
    assert reading.problems == [
        "node-017/gpu3: row remapping failed (DCGM_FI_DEV_ROW_REMAP_FAILURE = 1)"
    ]


def test_an_xid_is_sent_once_and_again_only_when_the_last_xid_changes() -> None:
    text = DCGM_TEXT
    source = DcgmExporterSource("node-017", fetch=lambda url, timeout: (text, TEXT))
    first = source.read(T0).messages
    assert [m.xid for m in first if isinstance(m, Gpu)] == [(), (48,), (), (13,)]
    again = source.read(T0 + 1).messages
    assert [m.xid for m in again if isinstance(m, Gpu)] == [(), (), (), ()]
    text = text.replace('err_code="48",err_msg="Double Bit ECC Error"', 'err_code="79"')
    text = text.replace('pod="llm-pretrain-worker-3"} 48', 'pod="llm-pretrain-worker-3"} 79')
    later = source.read(T0 + 2).messages
    assert [m.xid for m in later if isinstance(m, Gpu)] == [(), (79,), (), ()]


@pytest.mark.parametrize("label", ["Hostname", "hostname"])
def test_the_node_can_come_from_dcgm_exporters_host_label(label: str) -> None:
    text = DCGM_TEXT.replace("Hostname=", f"{label}=")
    source = DcgmExporterSource("fallback", fetch=serving(text), label_node=True)
    messages = source.read(T0).messages
    assert {m.node for m in messages if isinstance(m, Gpu)} == {"gpu-node-017"}
    plain = DcgmExporterSource("node-017", fetch=serving(text)).read(T0).messages
    assert plain == EXPECTED_GPUS


LABELS = 'gpu="{gpu}",UUID="GPU-{gpu}",device="nvidia{gpu}",modelName="Tesla V100-SXM2-16GB"'


def dcgm_lines(gpu_index: int, **values: str) -> str:
    labels = LABELS.format(gpu=gpu_index)
    return "".join(f"{name}{{{labels}}} {value}\n" for name, value in values.items())


def test_older_gpus_and_older_field_names() -> None:
    # A V100: no row remapping, so retired pages (single- and double-bit causes, as NVML
    # counts them); the throttle field under its pre-3.3 name; only the aggregate ECC count.
    text = dcgm_lines(
        0,
        DCGM_FI_DEV_RETIRED_SBE="2",
        DCGM_FI_DEV_RETIRED_DBE="1",
        DCGM_FI_DEV_CLOCK_THROTTLE_REASONS="8",
        DCGM_FI_DEV_ECC_DBE_AGG_TOTAL="4",
        DCGM_FI_DEV_XID_ERRORS="0",
    )
    reading = DcgmExporterSource("n", fetch=serving(text)).read(T0)
    assert reading.problems == []
    assert reading.messages == [
        gpu(0, node="n", retired_pages=3, throttle=("hw_slowdown",), ecc_dbe=4)
    ]


def test_dcgm_blank_values_leave_the_field_out() -> None:
    # DCGM's "no value" sentinels, as dcgm-exporter 2.x printed them.
    text = dcgm_lines(
        0,
        DCGM_FI_DEV_GPU_TEMP="9223372036854775794",
        DCGM_FI_DEV_POWER_USAGE="140737488355328.000000",
        DCGM_FI_DEV_SM_CLOCK="1530",
    )
    reading = DcgmExporterSource("n", fetch=serving(text)).read(T0)
    assert reading.problems == []
    assert reading.messages == [gpu(0, node="n", sm_mhz=1530.0)]


def test_bad_samples_are_problems_and_the_good_ones_still_give_messages() -> None:
    text = (
        dcgm_lines(0, DCGM_FI_DEV_GPU_TEMP="NaN", DCGM_FI_DEV_SM_CLOCK="1530")
        + 'DCGM_FI_DEV_SM_CLOCK{UUID="GPU-x"} 1410\n'  # no gpu label
        + 'DCGM_FI_DEV_SM_CLOCK{gpu="zero"} 1410\n'
        + 'DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-1" 1410\n'  # malformed
        + dcgm_lines(1, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL="-1", DCGM_FI_DEV_SM_CLOCK="1410")
        + 'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-other"} 50\n'  # another GPU's UUID
    )
    url = "http://10.0.0.5:9400/metrics"
    reading = DcgmExporterSource("n", url, fetch=serving(text)).read(T0)
    assert reading.messages == [gpu(0, node="n", sm_mhz=1530.0), gpu(1, node="n", sm_mhz=1410.0)]
    assert reading.problems == [
        f"{url} line 5: expected ',' or '}}' after label UUID",
        "DCGM_FI_DEV_SM_CLOCK (line 3): no gpu label",
        "DCGM_FI_DEV_SM_CLOCK (line 4): gpu label 'zero' is not a GPU index",
        "DCGM_FI_DEV_GPU_TEMP (line 8): n/gpu1 is GPU-1, this series says GPU-other; left out",
        "n/gpu0 DCGM_FI_DEV_GPU_TEMP (line 1): impossible value 'NaN'",
        "n/gpu1 DCGM_FI_DEV_ECC_DBE_VOL_TOTAL (line 6): not a count: '-1'",
    ]


def test_mig_instance_series_count_only_where_the_whole_gpu_has_none() -> None:
    whole = dcgm_lines(0, DCGM_FI_DEV_GPU_TEMP="60")
    instance = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 99\n'
        'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-0",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"} 1410\n'
    )
    reading = DcgmExporterSource("n", fetch=serving(instance + whole)).read(T0)
    assert reading.messages == [gpu(0, node="n", temp_c=60.0, sm_mhz=1410.0)]


# --- node_exporter ---------------------------------------------------------------------------


def by_port(messages: list[C4Model]) -> dict[str, Link]:
    return {m.port: m for m in messages if isinstance(m, Link)}


def test_node_exporter_output_gives_the_link_messages_sysfs_gives_for_the_same_tree() -> None:
    # node-exporter.txt is what prometheus-node-exporter 1.5 (Debian 12) served for
    # tests/fixtures/sysfs/gpu-node: its bytes are already x4, its rate in bytes/s.
    exporter = NodeExporterSource("node-017", fetch=serving(NODE_EXPORTER_TEXT))
    sysfs = SysfsSource("node-017", SYSFS_TREE, net_interfaces=frozenset())
    from_exporter, from_sysfs = exporter.read(T0), sysfs.read(T0)
    assert from_exporter.problems == [] and from_sysfs.problems == []
    got, want = by_port(from_exporter.messages), by_port(from_sysfs.messages)
    assert sorted(got) == sorted(want) == ["mlx5_0:1", "mlx5_0:2", "mlx5_1:1"]
    for port, link in want.items():
        expected = link.model_dump(exclude_none=True)
        only_in_sysfs = {key for key in expected["counters"] if key in HW_ONLY}
        for key in only_in_sysfs:
            del expected["counters"][key]
        assert got[port].model_dump(exclude_none=True) == expected, port
        assert not HW_ONLY & set(got[port].counters.model_dump(exclude_none=True))
    assert got["mlx5_0:1"].counters.tx_bytes == 4 * 2207698522321
    assert (got["mlx5_0:1"].state, got["mlx5_0:1"].gbps) == ("up", 400.0)
    assert (got["mlx5_0:2"].state, got["mlx5_0:2"].gbps) == ("down", 10.0)


def test_ethernet_interfaces_named_are_read_from_node_network_series() -> None:
    exporter = NodeExporterSource(
        "node-017", fetch=serving(NODE_EXPORTER_TEXT), net_interfaces=frozenset({"eth0"})
    )
    sysfs = SysfsSource("node-017", SYSFS_TREE, net_interfaces=frozenset({"eth0"}))
    got, want = by_port(exporter.read(T0).messages), by_port(sysfs.read(T0).messages)
    assert got["eth0"] == want["eth0"]
    assert (got["eth0"].state, got["eth0"].gbps, got["eth0"].counters.rx_err) == ("up", 100.0, 7)
    unnamed = NodeExporterSource("node-017", fetch=serving(NODE_EXPORTER_TEXT))
    assert "eth0" not in by_port(unnamed.read(T0).messages)


def test_node_exporter_problems_spoil_only_their_port() -> None:
    text = (
        'node_infiniband_state_id{device="mlx5_0",port="1"} 4\n'
        'node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"} 4e+3\n'
        'node_infiniband_port_data_received_bytes_total{device="mlx5_0",port="1"} 80\n'
        'node_infiniband_symbol_error_total{device="mlx5_0",port="1"} 0.5\n'
        'node_infiniband_state_id{device="mlx5_1"} 4\n'  # no port label
        'node_infiniband_port_data_received_bytes_total{device="mlx5_2",port="1"} 8\n'
        "node_infiniband_state_id{device=mlx5_3} 4\n"
        'node_infiniband_state_id{device="mlx5_4",port="1"} 1\n'
    )
    reading = NodeExporterSource("n", fetch=serving(text)).read(T0)
    links = by_port(reading.messages)
    assert sorted(links) == ["mlx5_0:1", "mlx5_4:1"]
    assert links["mlx5_0:1"].counters.model_dump(exclude_none=True) == {
        "tx_bytes": 4000,
        "rx_bytes": 80,
    }
    assert links["mlx5_4:1"].state == "down" and links["mlx5_4:1"].gbps is None
    assert reading.problems == [
        "http://127.0.0.1:9100/metrics line 7: expected '\"' at column 33",
        "node_infiniband_state_id (line 5): no port label",
        "n/mlx5_0:1 node_infiniband_symbol_error_total (line 4): not a counter: '0.5'",
        "n/mlx5_2:1: no node_infiniband_port_data_transmitted_bytes_total",
        "n/mlx5_2:1: no node_infiniband_state_id; port left out",
        "n/mlx5_4:1: no node_infiniband_port_data_transmitted_bytes_total",
        "n/mlx5_4:1: no node_infiniband_port_data_received_bytes_total",
    ]


# --- HTTP ------------------------------------------------------------------------------------


class Handler(http.server.BaseHTTPRequestHandler):
    """Answers from the server's ``routes``: path -> (status, content type, body, delay)."""

    server: Server

    def do_GET(self) -> None:  # noqa: N802 -- http.server's name
        status, content_type, body, delay = self.server.routes.get(
            urllib.parse.urlsplit(self.path).path, (404, "text/plain", b"not found", 0.0)
        )
        self.server.requests.append(self.path)
        time.sleep(delay)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet."""


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.routes: dict[str, tuple[int, str, bytes, float]] = {}
        self.requests: list[str] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.shutdown()
        running.server_close()
        thread.join(10)


def test_http_scrape_and_its_failures_are_one_line(server: Server) -> None:
    server.routes["/metrics"] = (200, TEXT, DCGM_TEXT.encode(), 0.0)
    server.routes["/broken"] = (500, "text/plain", b"collector failed", 0.0)
    server.routes["/slow"] = (200, TEXT, b"", 2.0)
    ok = DcgmExporterSource("node-017", server.base + "/metrics")
    assert ok.read(T0).messages == EXPECTED_GPUS
    with pytest.raises(SourceFailed, match=r"/broken: HTTP 500 Internal Server Error$"):
        http_get(server.base + "/broken", 5.0)
    with pytest.raises(SourceFailed, match=r"/slow: .*timed out|/slow: no answer within 0.3 s"):
        http_get(server.base + "/slow", 0.3)
    closed = Server()
    port = closed.server_address[1]
    closed.server_close()
    with pytest.raises(SourceFailed, match=r"Connection refused"):
        http_get(f"http://127.0.0.1:{port}/metrics", 2.0)


def test_the_agent_reports_a_failing_exporter_once_and_its_recovery(server: Server) -> None:
    server.routes["/metrics"] = (503, "text/plain", b"", 0.0)
    lines: list[str] = []
    sent: list[C4Model] = []
    source = DcgmExporterSource("node-017", server.base + "/metrics")
    agent = Agent([source], sent.append, lines.append, clock_ns=lambda: T0)
    agent.run_once()
    agent.run_once()
    server.routes["/metrics"] = (200, TEXT, DCGM_TEXT.encode(), 0.0)
    agent.run_once()
    assert lines[0].startswith("source dcgm-exporter: failed (HttpStatusError: http://127.0.0.1:")
    assert lines[0].endswith("/metrics: HTTP 503 Service Unavailable)")
    assert lines[1:] == [
        "source dcgm-exporter: recovered",
        "source dcgm-exporter: node-017/gpu3: row remapping failed "
        "(DCGM_FI_DEV_ROW_REMAP_FAILURE = 1)",
    ]
    assert sent == EXPECTED_GPUS


def test_openmetrics_answers_are_parsed_as_openmetrics(server: Server) -> None:
    body = b'node_infiniband_state_id{device="mlx5_0",port="1"} 4 1733130000.25\n# EOF\n'
    content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    server.routes["/metrics"] = (200, content_type, body, 0.0)
    reading = NodeExporterSource("n", server.base + "/metrics").read(T0)
    assert [m.port for m in reading.messages if isinstance(m, Link)] == ["mlx5_0:1"]


# --- Prometheus ------------------------------------------------------------------------------


def vector(*series: tuple[dict[str, str], str]) -> bytes:
    result = [{"metric": labels, "value": [1733130000.5, value]} for labels, value in series]
    answer = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(answer).encode()


def prometheus(server: Server, answers: dict[str, bytes]) -> None:
    """Answer each query by the metric name it starts with; an empty vector otherwise."""

    def route_for(name: str) -> bytes:
        return answers.get(name, vector())

    class Query(Handler):
        def do_GET(self) -> None:  # noqa: N802
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
            self.server.requests.append(query)
            name = query.split("{", 1)[0].strip()
            body = route_for(name)
            status = 400 if name == "BAD" else 200
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server.RequestHandlerClass = Query


def test_prometheus_gives_this_nodes_gpus_with_one_query_per_family(server: Server) -> None:
    labels = {"gpu": "2", "UUID": "GPU-2", "Hostname": "node-017", "instance": "10.0.0.5:9400"}
    prometheus(
        server,
        {
            "DCGM_FI_DEV_GPU_TEMP": vector((labels, "91")),
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": vector((labels, "72")),
            "DCGM_FI_DEV_XID_ERRORS": vector((labels, "79")),
        },
    )
    source = PrometheusGpuSource(server.base + "/", "node-017")
    reading = source.read(T0)
    assert reading.problems == []
    assert reading.messages == [gpu(2, (79,), temp_c=91.0, throttle=("hw_slowdown", "hw_thermal"))]
    assert len(server.requests) == len(source.families)
    assert (
        'DCGM_FI_DEV_GPU_TEMP{Hostname="node-017"} or DCGM_FI_DEV_GPU_TEMP{hostname="node-017"}'
        in server.requests
    )


def test_prometheus_as_one_collector_per_cluster(server: Server) -> None:
    a = {"device": "mlx5_0", "port": "1", "instance": "node-001:9100", "job": "node"}
    b = {"device": "mlx5_0", "port": "1", "instance": "[fd00::2]:9100", "job": "node"}
    prometheus(
        server,
        {
            "node_infiniband_state_id": vector((a, "4"), (b, "1")),
            "node_infiniband_port_data_transmitted_bytes_total": vector((a, "4e+3"), (b, "8")),
            "node_infiniband_port_data_received_bytes_total": vector((a, "40"), (b, "8")),
            "node_infiniband_rate_bytes_per_second": vector((a, "5e+10"), (b, "2.5e+10")),
        },
    )
    reading = PrometheusLinkSource(server.base, None).read(T0)
    assert reading.problems == []
    links = {(m.node, m.port): m for m in reading.messages if isinstance(m, Link)}
    assert sorted(links) == [("fd00::2", "mlx5_0:1"), ("node-001", "mlx5_0:1")]
    assert links[("node-001", "mlx5_0:1")].gbps == 400.0
    assert links[("fd00::2", "mlx5_0:1")].state == "down"
    assert "node_infiniband_state_id" in server.requests  # no node filter


def test_prometheus_node_filter_escapes_the_node_name(server: Server) -> None:
    prometheus(server, {})
    PrometheusLinkSource(server.base, "gpu.node+1").read(T0)
    assert 'node_infiniband_state_id{instance=~"gpu\\\\.node\\\\+1(:[0-9]+)?"}' in server.requests


def test_a_query_prometheus_rejects_is_a_problem_and_an_unreachable_server_a_failure(
    server: Server,
) -> None:
    prometheus(server, {"BAD": json.dumps({"status": "error", "error": "parse error"}).encode()})
    source = PrometheusLinkSource(server.base, "n")
    source.families = ("BAD", "node_infiniband_state_id")
    reading = source.read(T0)
    assert reading.problems == [
        f"{server.base}/api/v1/query: query 'BAD{{instance=~\"n(:[0-9]+)?\"}}': "
        "HTTP 400 parse error"
    ]
    with pytest.raises(SourceFailed, match="Connection refused"):
        PrometheusGpuSource("http://127.0.0.1:9", "n", timeout_s=2.0).read(T0)


# --- the agent's options ---------------------------------------------------------------------


def agent_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["agent", *argv])


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        ((), ["sysfs", "nvml"]),
        (("--dcgm-url",), ["sysfs", "dcgm-exporter"]),
        (("--node-exporter-url", "http://h:9100"), ["nvml", "node-exporter"]),
        (
            ("--dcgm-url", "--node-exporter-url", "--nvml"),
            ["nvml", "node-exporter", "dcgm-exporter"],
        ),
        (("--node-exporter-url", "--sysfs"), ["sysfs", "nvml", "node-exporter"]),
        (("--prometheus-url", "http://prom:9090"), ["prometheus-link", "prometheus-gpu"]),
        (("--dcgm-url", "--no-sysfs"), ["dcgm-exporter"]),
    ],
)
def test_an_exporter_replaces_the_source_it_stands_for(
    argv: tuple[str, ...], names: list[str]
) -> None:
    sources = build_sources(agent_args("--node", "n", *argv))
    assert [source.name for source in sources] == names


def test_exporter_urls_get_their_default_path() -> None:
    args = agent_args("--node", "n", "--dcgm-url", "--node-exporter-url", "https://h:9100/")
    sources = build_sources(args)
    assert [getattr(source, "url", None) for source in sources] == [
        "https://h:9100/metrics",
        DEFAULT_DCGM_URL,
    ]
    assert check_url("http://prom:9090/prometheus", "x") == "http://prom:9090/prometheus"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ("--dcgm-url", "ftp://h/metrics"),
            "--dcgm-url 'ftp://h/metrics': expected http:// or https://",
        ),
        (
            ("--node-exporter-url", "h:9100"),
            "--node-exporter-url 'h:9100': expected http:// or https://",
        ),
        (("--dcgm-url", "http://h:99999"), "--dcgm-url 'http://h:99999': not a port number"),
        (("--dcgm-url", "http:///metrics"), "--dcgm-url 'http:///metrics' names no host"),
        (
            ("--prometheus-url", "http://u:p@h"),
            "--prometheus-url 'http://u:p@h': credentials in the URL are not supported",
        ),
        (
            ("--prometheus-url", "http://h", "--dcgm-url"),
            "--prometheus-url reads both exporters: leave out --dcgm-url/--node-exporter-url",
        ),
        (("--prometheus-all-nodes",), "--prometheus-all-nodes needs --prometheus-url"),
        (
            ("--dcgm-url", "--exporter-timeout", "0"),
            "--exporter-timeout must be more than 0 s, got 0.0",
        ),
        (("--sysfs", "--no-sysfs"), "--sysfs and --no-sysfs contradict each other"),
    ],
)
def test_bad_exporter_options_stop_the_agent_with_one_line(
    argv: tuple[str, ...], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(AgentOptionError) as raised:
        build_sources(agent_args(*argv))
    assert str(raised.value) == error
    assert main(["agent", "--once", "--print", *argv]) == 2
    assert capsys.readouterr().err == f"c4: error: {error}\n"


def test_help_documents_the_exporter_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in (
        "--dcgm-url [URL]",
        "--node-exporter-url [URL]",
        "--prometheus-url URL",
        "--prometheus-all-nodes",
        "--exporter-timeout S",
        "--sysfs",
        "--nvml",
    ):
        assert option in text

"""GPU health and NIC port counters from exporters a cluster already runs, as v1 messages.

Three ways in, one mapping each way out, with the units of `producers.nvml` and
`producers.sysfs` (docs/exporters.md has the whole table):

- `DcgmExporterSource` scrapes NVIDIA's dcgm-exporter (default
  ``http://127.0.0.1:9400/metrics``) -> ``gpu`` messages. dcgm-exporter labels each GPU's
  series ``gpu`` (its index), ``UUID`` (``uuid`` with ``--use-old-namespace``), ``device``,
  ``modelName``, ``pci_bus_id`` and ``Hostname`` (``hostname`` from 4.5 on).
- `NodeExporterSource` scrapes node_exporter (default ``http://127.0.0.1:9100/metrics``) ->
  ``link`` messages: its InfiniBand collector (``node_infiniband_*{device, port}``) for every
  RDMA port, and for the Ethernet interfaces named, ``node_network_*{device}``.
  node_exporter has already multiplied ``port_xmit_data``/``port_rcv_data`` by 4, so its bytes
  are the bytes `producers.sysfs` computes; it does not read mlx5's ``hw_counters``, so
  ``out_of_seq``, ``cnp_sent``, ``cnp_handled`` and ``timeout_retrans`` are never present.
- `PrometheusGpuSource` / `PrometheusLinkSource` read the same series from a Prometheus
  server's instant-query API, one query per metric family: for this node only (dcgm series
  by their ``Hostname``/``hostname`` label, node_exporter series by the host of their
  ``instance``), or for every node (one collector per cluster), each message then named
  after the node its series came from.

A round whose exporter cannot be reached, or answers with an HTTP error, fails
(`SourceFailed`, one line naming the URL; tried again next interval). A malformed line, a
missing label or an impossible value is one problem line; the other samples still give
their messages. DCGM's "blank" values (the field is not supported) leave the field out.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from producers.nvml import throttle_names
from producers.prometheus_text import Sample, parse
from producers.sources import Reading, SourceFailed
from producers.sysfs import MAX_COUNTER
from schemas.base import C4Model
from schemas.messages import Gpu, Link, LinkCounters

DEFAULT_DCGM_URL = "http://127.0.0.1:9400/metrics"
DEFAULT_NODE_EXPORTER_URL = "http://127.0.0.1:9100/metrics"
DEFAULT_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 64 << 20
MAX_PROBLEMS = 20  # per round and kind; the rest are counted in one more line
ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"
USER_AGENT = "c4-agent"

# --- DCGM fields (dcgm-exporter's etc/default-counters.csv names) -> gpu message -------------
XID = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the value of the last XID seen
TEMP = "DCGM_FI_DEV_GPU_TEMP"  # C
POWER = "DCGM_FI_DEV_POWER_USAGE"  # W
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz
ECC_DBE = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")  # first present
REMAPPED_ROWS = ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")
RETIRED_PAGES = ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE")
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
# DCGM 3.3 renamed the throttle field (same id, same bits as NVML's clock event reasons).
THROTTLE = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
NVLINK_ERRORS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
DCGM_FAMILIES: tuple[str, ...] = (
    XID,
    TEMP,
    POWER,
    SM_CLOCK,
    *ECC_DBE,
    *REMAPPED_ROWS,
    *RETIRED_PAGES,
    ROW_REMAP_FAILURE,
    *THROTTLE,
    *NVLINK_ERRORS,
)
# DCGM writes "no value" as these (DCGM_INT64_BLANK and up, DCGM_FP64_BLANK and up).
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
HOSTNAME_LABELS = ("Hostname", "hostname")
UUID_LABELS = ("UUID", "uuid")

# --- node_exporter -> link message -----------------------------------------------------------
IB = "node_infiniband_"
# node_exporter name (after "node_infiniband_") -> LinkCounters field; bytes already x4.
IB_COUNTERS: dict[str, str] = {
    "port_data_transmitted_bytes_total": "tx_bytes",
    "port_data_received_bytes_total": "rx_bytes",
    "port_packets_transmitted_total": "tx_pkts",
    "port_packets_received_total": "rx_pkts",
    "port_transmit_wait_total": "tx_wait",
    "symbol_error_total": "symbol_err",
    "link_downed_total": "link_down",
    "port_errors_received_total": "rx_err",
}
IB_STATE = "state_id"  # 4: ACTIVE
IB_RATE = "rate_bytes_per_second"  # sysfs rate in Gb/s x 125000000
IB_ACTIVE = 4
IB_REQUIRED = ("tx_bytes", "rx_bytes")  # what producers.sysfs reports missing, too
NET = "node_network_"
NET_COUNTERS: dict[str, str] = {
    "transmit_bytes_total": "tx_bytes",
    "receive_bytes_total": "rx_bytes",
    "transmit_packets_total": "tx_pkts",
    "receive_packets_total": "rx_pkts",
    "receive_errs_total": "rx_err",
}
NET_STATE = "up"  # 1 when operstate is "up"
NET_SPEED = "speed_bytes"  # sysfs speed in Mb/s x 125000
NET_REQUIRED = ("tx_bytes", "rx_bytes")
IB_FAMILIES: tuple[str, ...] = tuple(IB + name for name in (*IB_COUNTERS, IB_STATE, IB_RATE))
NET_FAMILIES: tuple[str, ...] = tuple(NET + name for name in (*NET_COUNTERS, NET_STATE, NET_SPEED))

Fetch = Callable[[str, float], tuple[str, str]]


class HttpStatusError(SourceFailed):
    """The server answered with an HTTP error status (``code``)."""

    def __init__(self, message: str, code: int, body: bytes = b"") -> None:
        super().__init__(message)
        self.code, self.body = code, body


# --- HTTP ------------------------------------------------------------------------------------


def check_url(text: str, what: str, *, default_path: str = "") -> str:
    """``text`` as an http(s) URL to use (``default_path`` added when it has no path);
    ValueError with a one-line reason otherwise."""
    if not text or any(char.isspace() for char in text):
        message = f"{what} {text!r} is not a URL"
        raise ValueError(message)
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in {"http", "https"}:
        message = f"{what} {text!r}: expected http:// or https://"
        raise ValueError(message)
    if not parts.hostname:
        message = f"{what} {text!r} names no host"
        raise ValueError(message)
    if parts.username is not None or parts.password is not None:
        message = f"{what} {text!r}: credentials in the URL are not supported"
        raise ValueError(message)
    if parts.fragment:
        message = f"{what} {text!r}: a URL with a #fragment"
        raise ValueError(message)
    try:
        parts.port  # noqa: B018 -- raises ValueError on a port out of range or not a number
    except ValueError:
        message = f"{what} {text!r}: not a port number"
        raise ValueError(message) from None
    if default_path and parts.path in {"", "/"}:
        parts = parts._replace(path=default_path)
    return urllib.parse.urlunsplit(parts)


# Exporters are on the node or in the cluster: environment proxies are not used.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout_s: float) -> tuple[str, str]:
    """The body (UTF-8) and content type of a GET; SourceFailed, one line, on any failure."""
    request = urllib.request.Request(  # noqa: S310 -- http(s) only, checked by check_url
        url, headers={"Accept": ACCEPT, "User-Agent": USER_AGENT}
    )
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            body: bytes = response.read(MAX_RESPONSE_BYTES + 1)
            content_type = str(response.headers.get("Content-Type", ""))
    except urllib.error.HTTPError as error:
        message = f"{url}: HTTP {error.code} {error.reason}"
        try:
            body = error.read(4096)
        except OSError:
            body = b""
        finally:
            error.close()
        raise HttpStatusError(message, error.code, body) from None
    except urllib.error.URLError as error:
        message = f"{url}: {error.reason}"
        raise SourceFailed(message) from None
    except TimeoutError:
        message = f"{url}: no answer within {timeout_s:g} s"
        raise SourceFailed(message) from None
    except OSError as error:
        message = f"{url}: {error.strerror or error}"
        raise SourceFailed(message) from None
    if len(body) > MAX_RESPONSE_BYTES:
        message = f"{url}: answer larger than {MAX_RESPONSE_BYTES >> 20} MiB"
        raise SourceFailed(message)
    return body.decode("utf-8", errors="replace"), content_type


def scrape(url: str, timeout_s: float, fetch: Fetch) -> tuple[list[Sample], list[str]]:
    """The samples of one exposition and its problems (each naming the URL)."""
    text, content_type = fetch(url, timeout_s)
    exposition = parse(text, openmetrics=content_type.startswith("application/openmetrics-text"))
    return exposition.samples, [f"{url} {problem}" for problem in exposition.problems]


class _Problems:
    """Problem lines of one round, capped (an exporter broken throughout says so once)."""

    def __init__(self, into: list[str]) -> None:
        self.into, self.dropped = into, 0

    def add(self, line: str) -> None:
        if len(self.into) < MAX_PROBLEMS:
            self.into.append(line)
        else:
            self.dropped += 1

    def close(self) -> None:
        if self.dropped:
            self.into.append(f"{self.dropped} more problems not listed")


def _where(sample: Sample) -> str:
    return f"{sample.name} (line {sample.line})" if sample.line else sample.name


def _host_of(instance: str) -> str:
    """The host part of a Prometheus ``instance`` label (``host:port``, ``[v6]:port``)."""
    if instance.startswith("["):
        return instance[1:].split("]", 1)[0]
    host, colon, port = instance.rpartition(":")
    return host if colon and port.isdigit() and host else instance


# --- gpu messages ----------------------------------------------------------------------------


@dataclass(slots=True)
class XidTracker:
    """dcgm-exporter shows the last XID of each GPU, not each one: a value that differs from
    the one seen before (the first one seen included) is a new XID. The same XID again is
    not visible this way."""

    last: dict[tuple[str, int], int] = field(default_factory=dict)

    def new(self, node: str, gpu: int, value: int) -> tuple[int, ...]:
        previous = self.last.get((node, gpu))
        self.last[(node, gpu)] = value
        return (value,) if value != 0 and value != previous else ()


@dataclass(slots=True)
class _GpuSeries:
    uuid: str | None = None
    device: dict[str, Sample] = field(default_factory=dict)  # whole-GPU series
    instance: dict[str, Sample] = field(default_factory=dict)  # MIG instances' series

    def get(self, name: str) -> Sample | None:
        return self.device.get(name) or self.instance.get(name)


def _gpu_node(labels: Mapping[str, str], node: str, label_node: bool) -> str:
    if label_node:
        for name in (*HOSTNAME_LABELS, "instance"):
            value = labels.get(name)
            if value:
                return _host_of(value) if name == "instance" else value
    return node


def _gpu_int(sample: Sample, where: str, problems: _Problems) -> int | None:
    value = sample.as_int()
    if value is not None and value >= DCGM_INT64_BLANK:
        return None  # DCGM's blank: not supported here
    if value is None or value < 0 or value > MAX_COUNTER:
        problems.add(f"{where} {_where(sample)}: not a count: {sample.text[:40]!r}")
        return None
    return value


def _gpu_float(sample: Sample, where: str, problems: _Problems, low: float) -> float | None:
    value = sample.value
    if math.isfinite(value) and value >= DCGM_FP64_BLANK:
        return None  # DCGM's blank
    if not math.isfinite(value) or value < low:
        problems.add(f"{where} {_where(sample)}: impossible value {sample.text[:40]!r}")
        return None
    return value


def _sum(series: _GpuSeries, names: Sequence[str], where: str, problems: _Problems) -> int | None:
    """The sum of the counts present among ``names``; None when none is."""
    total, found = 0, False
    for name in names:
        sample = series.get(name)
        if sample is None:
            continue
        value = _gpu_int(sample, where, problems)
        if value is not None:
            total, found = total + value, True
    return min(total, MAX_COUNTER) if found else None


def _first(series: _GpuSeries, names: Sequence[str]) -> Sample | None:
    for name in names:
        sample = series.get(name)
        if sample is not None:
            return sample
    return None


def _gpu_fields(series: _GpuSeries, where: str, problems: _Problems) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, key, low in (
        (TEMP, "temp_c", -273.15),
        (POWER, "power_w", 0.0),
        (SM_CLOCK, "sm_mhz", 0.0),
    ):
        sample = series.get(name)
        if sample is not None:
            value = _gpu_float(sample, where, problems, low)
            if value is not None:
                fields[key] = float(value)
    ecc = _first(series, ECC_DBE)
    if ecc is not None:
        fields["ecc_dbe"] = _gpu_int(ecc, where, problems)
    # As producers.nvml: remapped rows (both kinds) on GPUs that remap, else retired pages.
    rows = _sum(series, REMAPPED_ROWS, where, problems)
    fields["retired_pages"] = (
        rows if rows is not None else _sum(series, RETIRED_PAGES, where, problems)
    )
    throttle = _first(series, THROTTLE)
    if throttle is not None:
        mask = _gpu_int(throttle, where, problems)
        if mask is not None:
            fields["throttle"] = throttle_names(mask)
    fields["nvlink_err"] = _sum(series, NVLINK_ERRORS, where, problems)
    failure = series.get(ROW_REMAP_FAILURE)
    if failure is not None and _gpu_int(failure, where, problems):
        # The v1 gpu message has no field for it: said here, as a problem of the GPU.
        problems.add(f"{where}: row remapping failed ({ROW_REMAP_FAILURE} = {failure.text})")
    return {key: value for key, value in fields.items() if value is not None}


def gpu_messages(
    samples: Iterable[Sample],
    node: str,
    ts_ns: int,
    xids: XidTracker,
    *,
    label_node: bool = False,
) -> tuple[list[C4Model], list[str]]:
    """One gpu message per GPU found among dcgm-exporter's ``samples``, with the problems.

    ``label_node``: the node is the series' ``Hostname``/``hostname`` label (or the host of
    its ``instance``) where it has one, else ``node``.
    """
    lines: list[str] = []
    problems = _Problems(lines)
    wanted = frozenset(DCGM_FAMILIES)
    gpus: dict[tuple[str, int], _GpuSeries] = {}
    for sample in samples:
        if sample.name not in wanted:
            continue
        index_text = sample.labels.get("gpu")
        if index_text is None:
            problems.add(f"{_where(sample)}: no gpu label")
            continue
        if not (index_text.isascii() and index_text.isdigit()) or len(index_text) > 6:
            problems.add(f"{_where(sample)}: gpu label {index_text[:20]!r} is not a GPU index")
            continue
        where_node = _gpu_node(sample.labels, node, label_node)
        series = gpus.setdefault((where_node, int(index_text)), _GpuSeries())
        uuid = next((sample.labels[n] for n in UUID_LABELS if sample.labels.get(n)), None)
        if uuid is not None:
            if series.uuid is None:
                series.uuid = uuid
            elif uuid != series.uuid:
                problems.add(
                    f"{_where(sample)}: {where_node}/gpu{index_text} is {series.uuid}, "
                    f"this series says {uuid}; left out"
                )
                continue
        into = series.instance if sample.labels.get("GPU_I_ID") else series.device
        into.setdefault(sample.name, sample)
    messages: list[C4Model] = []
    for (gpu_node, index), series in sorted(gpus.items()):
        where = f"{gpu_node}/gpu{index}"
        fields = _gpu_fields(series, where, problems)
        xid = series.get(XID)
        seen: tuple[int, ...] = ()
        if xid is not None:
            value = _gpu_int(xid, where, problems)
            if value is not None:
                seen = xids.new(gpu_node, index, value)
        try:
            messages.append(
                Gpu(v=1, kind="gpu", node=gpu_node, gpu=index, ts_ns=ts_ns, xid=seen, **fields)
            )
        except ValidationError as error:
            problems.add(f"{where}: no message ({error.errors()[0]['msg']})")
    problems.close()
    return messages, lines


# --- link messages ---------------------------------------------------------------------------


@dataclass(slots=True)
class _PortSeries:
    ethernet: bool
    samples: dict[str, Sample] = field(default_factory=dict)


def _port_node(labels: Mapping[str, str], node: str, label_node: bool) -> str:
    if label_node:
        instance = labels.get("instance")
        if instance:
            return _host_of(instance)
    return node


def _count(sample: Sample, where: str, problems: _Problems) -> int | None:
    value = sample.as_int()
    if value is None or value < 0:
        problems.add(f"{where} {_where(sample)}: not a counter: {sample.text[:40]!r}")
        return None
    if value > MAX_COUNTER:
        problems.add(f"{where} {_where(sample)}: counter beyond 64 bits: {sample.text[:40]!r}")
        return None
    return value


def _link(
    node: str, port: str, series: _PortSeries, ts_ns: int, problems: _Problems
) -> Link | None:
    where = f"{node}/{port}"
    prefix, names, state_name, speed_name, required = (
        (NET, NET_COUNTERS, NET_STATE, NET_SPEED, NET_REQUIRED)
        if series.ethernet
        else (IB, IB_COUNTERS, IB_STATE, IB_RATE, IB_REQUIRED)
    )
    values: dict[str, int] = {}
    for name, key in names.items():
        sample = series.samples.get(prefix + name)
        if sample is None:
            if key in required:
                problems.add(f"{where}: no {prefix + name}")
            continue
        value = _count(sample, where, problems)
        if value is not None:
            values[key] = value
    state = series.samples.get(prefix + state_name)
    if state is None:
        problems.add(f"{where}: no {prefix + state_name}; port left out")
        return None
    state_value = state.as_int()
    if state_value is None or state_value < 0:
        problems.add(f"{where} {_where(state)}: not a state: {state.text[:40]!r}; port left out")
        return None
    up = state_value == 1 if series.ethernet else state_value == IB_ACTIVE
    gbps: float | None = None
    speed = series.samples.get(prefix + speed_name)
    if speed is not None:
        if not math.isfinite(speed.value) or speed.value < 0:
            problems.add(f"{where} {_where(speed)}: not a speed: {speed.text[:40]!r}")
        elif speed.value > 0 or not series.ethernet:
            # Bytes/s -> Gb/s (node_exporter computed them from sysfs' Gb/s or Mb/s).
            gbps = round(speed.value * 8 / 1e9, 3)
    return Link(
        v=1,
        kind="link",
        node=node,
        port=port,
        ts_ns=ts_ns,
        state="up" if up else "down",
        gbps=gbps,
        counters=LinkCounters(**values),
    )


def link_messages(
    samples: Iterable[Sample],
    node: str,
    ts_ns: int,
    *,
    net_interfaces: frozenset[str] = frozenset(),
    label_node: bool = False,
) -> tuple[list[C4Model], list[str]]:
    """One link message per InfiniBand/RoCE port and per named Ethernet interface found
    among node_exporter's ``samples``, with the problems. ``label_node``: the node is the
    host of each series' ``instance`` label, else ``node``."""
    lines: list[str] = []
    problems = _Problems(lines)
    ib_wanted, net_wanted = frozenset(IB_FAMILIES), frozenset(NET_FAMILIES)
    ports: dict[tuple[str, str], _PortSeries] = {}
    for sample in samples:
        ethernet = sample.name in net_wanted
        if not ethernet and sample.name not in ib_wanted:
            continue
        device = sample.labels.get("device")
        if not device:
            problems.add(f"{_where(sample)}: no device label")
            continue
        if ethernet:
            if device not in net_interfaces:
                continue
            port = device
        else:
            number = sample.labels.get("port")
            if not number:
                problems.add(f"{_where(sample)}: no port label")
                continue
            port = f"{device}:{number}"
        key = (_port_node(sample.labels, node, label_node), port)
        series = ports.setdefault(key, _PortSeries(ethernet))
        if sample.name in series.samples:
            problems.add(f"{_where(sample)}: second series for {key[0]}/{port}; left out")
            continue
        series.samples[sample.name] = sample
    messages: list[C4Model] = []
    for (port_node, port), series in sorted(ports.items()):
        try:
            link = _link(port_node, port, series, ts_ns, problems)
        except ValidationError as error:
            problems.add(f"{port_node}/{port}: no message ({error.errors()[0]['msg']})")
            continue
        if link is not None:
            messages.append(link)
    problems.close()
    return messages, lines


# --- sources ---------------------------------------------------------------------------------


class DcgmExporterSource:
    """gpu messages from a dcgm-exporter endpoint, one per GPU per round.

    The node is ``node``; with ``label_node``, the series' ``Hostname`` label where it has
    one (dcgm-exporter's host name), ``node`` otherwise.
    """

    def __init__(
        self,
        node: str,
        url: str = DEFAULT_DCGM_URL,
        interval_s: float = 5.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        label_node: bool = False,
        fetch: Fetch = http_get,
    ) -> None:
        self.name = "dcgm-exporter"
        self.interval_s = interval_s
        self.node, self.url, self.timeout_s = node, url, timeout_s
        self._label_node, self._fetch = label_node, fetch
        self.xids = XidTracker()

    def read(self, now_ns: int) -> Reading:
        """Scrape once; one gpu message per GPU."""
        samples, problems = scrape(self.url, self.timeout_s, self._fetch)
        messages, more = gpu_messages(
            samples, self.node, now_ns, self.xids, label_node=self._label_node
        )
        return Reading(messages, [*problems, *more])

    def close(self) -> None:
        """Nothing is held open."""


class NodeExporterSource:
    """link messages from a node_exporter endpoint: its InfiniBand collector's ports, and
    the Ethernet interfaces in ``net_interfaces``."""

    def __init__(
        self,
        node: str,
        url: str = DEFAULT_NODE_EXPORTER_URL,
        interval_s: float = 1.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        net_interfaces: frozenset[str] = frozenset(),
        fetch: Fetch = http_get,
    ) -> None:
        self.name = "node-exporter"
        self.interval_s = interval_s
        self.node, self.url, self.timeout_s = node, url, timeout_s
        self._net, self._fetch = net_interfaces, fetch

    def read(self, now_ns: int) -> Reading:
        """Scrape once; one link message per port."""
        samples, problems = scrape(self.url, self.timeout_s, self._fetch)
        messages, more = link_messages(samples, self.node, now_ns, net_interfaces=self._net)
        return Reading(messages, [*problems, *more])

    def close(self) -> None:
        """Nothing is held open."""


# --- Prometheus' query API -------------------------------------------------------------------

_REGEX_SPECIAL = re.compile(r"([.\\+*?()|\[\]{}^$])")


def _promql_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class PrometheusQuery:
    """Instant vector queries against a Prometheus server (``<url>/api/v1/query``)."""

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, fetch: Fetch = http_get):
        self.url = url.rstrip("/") + "/api/v1/query"
        self.timeout_s, self._fetch = timeout_s, fetch

    def vector(self, name: str, query: str) -> list[Sample]:
        """The series of ``query`` as samples named ``name``; SourceFailed when the server
        cannot be reached, ValueError (one line) when it answers with an error."""
        url = self.url + "?" + urllib.parse.urlencode({"query": query})
        try:
            text, _type = self._fetch(url, self.timeout_s)
        except HttpStatusError as error:
            if not 400 <= error.code < 500:
                raise
            # A query the server rejects (400 bad, 422 cannot be run): this family only.
            message = f"query {query!r}: HTTP {error.code} {_api_error(error.body)}"
            raise ValueError(message.rstrip()) from None
        try:
            answer = json.loads(text)
        except json.JSONDecodeError:
            message = f"query {query!r}: the answer is not JSON"
            raise ValueError(message) from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            reason = _api_error(text.encode()) or "not a success"
            message = f"query {query!r}: {reason}"
            raise ValueError(message)
        data = answer.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            message = f"query {query!r}: not an instant vector"
            raise ValueError(message)
        return self._samples(name, query, data.get("result"))

    @staticmethod
    def _samples(name: str, query: str, result: object) -> list[Sample]:
        if not isinstance(result, list):
            message = f"query {query!r}: no result list"
            raise ValueError(message)
        samples: list[Sample] = []
        for item in result:
            metric = item.get("metric") if isinstance(item, dict) else None
            value = item.get("value") if isinstance(item, dict) else None
            if (
                not isinstance(metric, dict)
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
                or not isinstance(value, list)
                or len(value) != 2
                or not isinstance(value[1], str)
            ):
                message = f"query {query!r}: a malformed series"
                raise ValueError(message)
            labels = {k: v for k, v in metric.items() if k != "__name__"}
            text = value[1]
            try:
                number = float(text)
            except ValueError:
                message = f"query {query!r}: not a value: {text[:40]!r}"
                raise ValueError(message) from None
            samples.append(Sample(name, labels, number, text))
        return samples


def _api_error(body: bytes) -> str:
    """The ``error`` of a Prometheus API error answer, shortened; empty when none."""
    try:
        answer = json.loads(body.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return ""
    error = answer.get("error") if isinstance(answer, dict) else None
    return " ".join(str(error).split())[:200] if error else ""


def _gpu_query(name: str, node: str | None) -> str:
    if node is None:
        return name
    value = _promql_string(node)
    return " or ".join(f"{name}{{{label}={value}}}" for label in HOSTNAME_LABELS)


def _port_query(name: str, node: str | None) -> str:
    if node is None:
        return name
    pattern = _REGEX_SPECIAL.sub(r"\\\1", node) + r"(:[0-9]+)?"
    return f"{name}{{instance=~{_promql_string(pattern)}}}"


class _PrometheusSource:
    """One query per metric family, every round."""

    families: tuple[str, ...] = ()

    def __init__(
        self,
        url: str,
        node: str | None,
        interval_s: float,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        fetch: Fetch = http_get,
    ) -> None:
        self.interval_s = interval_s
        self.node = node
        self.query = PrometheusQuery(url, timeout_s, fetch)

    def _query(self, name: str) -> str:
        raise NotImplementedError

    def _samples(self) -> tuple[list[Sample], list[str]]:
        samples: list[Sample] = []
        problems: list[str] = []
        for name in self.families:
            try:
                samples.extend(self.query.vector(name, self._query(name)))
            except ValueError as error:
                problems.append(f"{self.query.url}: {error}")
        return samples, problems

    def close(self) -> None:
        """Nothing is held open."""


class PrometheusGpuSource(_PrometheusSource):
    """gpu messages from dcgm-exporter's series in Prometheus: this node's (``node``,
    matched against the ``Hostname``/``hostname`` label), or every node's (``node`` None)."""

    families = DCGM_FAMILIES

    def __init__(
        self,
        url: str,
        node: str | None,
        interval_s: float = 5.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        fetch: Fetch = http_get,
    ) -> None:
        super().__init__(url, node, interval_s, timeout_s, fetch=fetch)
        self.name = "prometheus-gpu"
        self.xids = XidTracker()

    def _query(self, name: str) -> str:
        return _gpu_query(name, self.node)

    def read(self, now_ns: int) -> Reading:
        """One query per DCGM field; one gpu message per GPU."""
        samples, problems = self._samples()
        messages, more = gpu_messages(
            samples, self.node or "", now_ns, self.xids, label_node=self.node is None
        )
        return Reading(messages, [*problems, *more])


class PrometheusLinkSource(_PrometheusSource):
    """link messages from node_exporter's series in Prometheus: this node's (``node``,
    matched against the host of the ``instance`` label), or every node's (``node`` None)."""

    def __init__(
        self,
        url: str,
        node: str | None,
        interval_s: float = 1.0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        net_interfaces: frozenset[str] = frozenset(),
        fetch: Fetch = http_get,
    ) -> None:
        super().__init__(url, node, interval_s, timeout_s, fetch=fetch)
        self.name = "prometheus-link"
        self._net = net_interfaces
        self.families = IB_FAMILIES + (NET_FAMILIES if net_interfaces else ())

    def _query(self, name: str) -> str:
        return _port_query(name, self.node)

    def read(self, now_ns: int) -> Reading:
        """One query per node_exporter family; one link message per port."""
        samples, problems = self._samples()
        messages, more = link_messages(
            samples,
            self.node or "",
            now_ns,
            net_interfaces=self._net,
            label_node=self.node is None,
        )
        return Reading(messages, [*problems, *more])

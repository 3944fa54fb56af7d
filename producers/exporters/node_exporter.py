"""node_exporter's InfiniBand and network series -> v1 ``link`` messages, in the units of
`producers.sysfs` (docs/exporters.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from producers.exporters.scrape import Problems, host_of, located
from producers.prometheus_text import Sample
from producers.sysfs import MAX_COUNTER
from schemas.base import C4Model
from schemas.messages import Link, LinkCounters

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

# --- link messages ---------------------------------------------------------------------------


@dataclass(slots=True)
class _PortSeries:
    ethernet: bool
    samples: dict[str, Sample] = field(default_factory=dict)


def _port_node(labels: Mapping[str, str], node: str, label_node: bool) -> str:
    if label_node:
        instance = labels.get("instance")
        if instance:
            return host_of(instance)
    return node


def _count(sample: Sample, where: str, problems: Problems) -> int | None:
    value = sample.as_int()
    if value is None or value < 0:
        problems.add(f"{where} {located(sample)}: not a counter: {sample.text[:40]!r}")
        return None
    if value > MAX_COUNTER:
        problems.add(f"{where} {located(sample)}: counter beyond 64 bits: {sample.text[:40]!r}")
        return None
    return value


def _link(node: str, port: str, series: _PortSeries, ts_ns: int, problems: Problems) -> Link | None:
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
        problems.add(f"{where} {located(state)}: not a state: {state.text[:40]!r}; port left out")
        return None
    up = state_value == 1 if series.ethernet else state_value == IB_ACTIVE
    gbps: float | None = None
    speed = series.samples.get(prefix + speed_name)
    if speed is not None:
        if not math.isfinite(speed.value) or speed.value < 0:
            problems.add(f"{where} {located(speed)}: not a speed: {speed.text[:40]!r}")
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
    problems = Problems(lines)
    ib_wanted, net_wanted = frozenset(IB_FAMILIES), frozenset(NET_FAMILIES)
    ports: dict[tuple[str, str], _PortSeries] = {}
    for sample in samples:
        ethernet = sample.name in net_wanted
        if not ethernet and sample.name not in ib_wanted:
            continue
        device = sample.labels.get("device")
        if not device:
            problems.add(f"{located(sample)}: no device label")
            continue
        if ethernet:
            if device not in net_interfaces:
                continue
            port = device
        else:
            number = sample.labels.get("port")
            if not number:
                problems.add(f"{located(sample)}: no port label")
                continue
            port = f"{device}:{number}"
        key = (_port_node(sample.labels, node, label_node), port)
        series = ports.setdefault(key, _PortSeries(ethernet))
        if sample.name in series.samples:
            problems.add(f"{located(sample)}: second series for {key[0]}/{port}; left out")
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

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

from producers.exporters.dcgm import XidTracker, gpu_messages
from producers.exporters.node_exporter import link_messages
from producers.exporters.prometheus_api import (
    PrometheusGpuSource,
    PrometheusLinkSource,
    PrometheusQuery,
)
from producers.exporters.scrape import (
    DEFAULT_DCGM_URL,
    DEFAULT_NODE_EXPORTER_URL,
    DEFAULT_TIMEOUT_S,
    HttpStatusError,
    check_url,
    http_get,
    scrape,
)
from producers.exporters.sources import DcgmExporterSource, NodeExporterSource

__all__ = [
    "DEFAULT_DCGM_URL",
    "DEFAULT_NODE_EXPORTER_URL",
    "DEFAULT_TIMEOUT_S",
    "DcgmExporterSource",
    "HttpStatusError",
    "NodeExporterSource",
    "PrometheusGpuSource",
    "PrometheusLinkSource",
    "PrometheusQuery",
    "XidTracker",
    "check_url",
    "gpu_messages",
    "http_get",
    "link_messages",
    "scrape",
]

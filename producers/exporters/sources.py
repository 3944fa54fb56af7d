"""The direct-scrape sources: dcgm-exporter and node_exporter endpoints polled by the agent."""

from __future__ import annotations

from producers.exporters.dcgm import XidTracker, gpu_messages
from producers.exporters.node_exporter import link_messages
from producers.exporters.scrape import (
    DEFAULT_DCGM_URL,
    DEFAULT_NODE_EXPORTER_URL,
    DEFAULT_TIMEOUT_S,
    Fetch,
    http_get,
    scrape,
)
from producers.sources import Reading

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

"""The same series read from a Prometheus server's instant-query API (one collector per
node, or per cluster)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request

from producers.exporters.dcgm import DCGM_FAMILIES, HOSTNAME_LABELS, XidTracker, gpu_messages
from producers.exporters.node_exporter import IB_FAMILIES, NET_FAMILIES, link_messages
from producers.exporters.scrape import DEFAULT_TIMEOUT_S, Fetch, HttpStatusError, http_get
from producers.prometheus_text import Sample
from producers.sources import Reading

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

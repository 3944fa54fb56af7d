"""Posting to Alertmanagers: each alert step's alert, then every firing one again until it ends.

`AlertmanagerClient.send` posts the alert of one alert step to ``<url>/api/v2/alerts``. A
firing alert is kept in the cluster state (`ActiveAlerts`) before it is posted, so that a
worker that crashes, restarts or could not reach the Alertmanager still resends it; a
resolution replaces it and is forgotten once delivered. `AlertmanagerClient.resend` is the
worker's housekeeping: once per ``resend_s`` for each Alertmanager receiver, it posts the kept
alerts it owns in one request (firing ones with a new ``endsAt`` horizon, resolutions that did
not get through yet), as a Prometheus server re-sends its active alerts. An alert the
Alertmanager rejected (4xx other than 408 and 429) is not kept: posting it again cannot help.

One sender per alert across a consumer group: the kept alerts are shared (Redis), so each is
resent only by the worker that owns the partition of the diagnosis topic its finding came on
(`Kept.partition`), the worker that also handles that finding's next record. Every worker
resending every kept alert would post each one as many times as the group has workers, and a
worker resending a firing alert while another posts its resolution could fire it again.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

import orjson

from actions.config import Receiver
from actions.drivers.alertmanager.v2 import HORIZON_PERIODS, Kept, alerts_url, kept_for
from actions.pipeline.outcome import StepSummary
from actions.state.protocols import ActiveAlerts
from actions.webhook import Answer, post_json
from schemas.messages import Diagnosis

PostWithHeaders = Callable[[str, bytes, float, Mapping[str, str]], Answer]

RESOLVED_KEEP_NS = 15 * 60 * 10**9  # an undelivered resolution is retried this long (Prometheus)
BATCH = 500  # alerts per resend request

log = logging.getLogger("c4.actions")


def auth_headers(receiver: Receiver) -> dict[str, str]:
    """The Authorization header of a receiver with a bearer token or basic authentication."""
    if receiver.token is not None:
        return {"Authorization": f"Bearer {receiver.token.get_secret_value()}"}
    auth = receiver.basic_auth
    if auth is not None and auth.password is not None:
        pair = f"{auth.username}:{auth.password.get_secret_value()}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
    return {}


def _post(url: str, body: bytes, timeout_s: float, headers: Mapping[str, str]) -> Answer:
    return post_json(url, body, timeout_s, None, headers)


class MemoryAlerts:
    """`ActiveAlerts` in this process's memory (tests; a worker uses the cluster state's)."""

    def __init__(self) -> None:
        self.alerts: dict[str, dict[str, str]] = {}

    def keep(self, receiver: str, diagnosis: str, alert: str) -> None:
        self.alerts.setdefault(receiver, {})[diagnosis] = alert

    def forget(self, receiver: str, diagnosis: str) -> None:
        self.alerts.get(receiver, {}).pop(diagnosis, None)

    def kept(self, receiver: str, diagnosis: str) -> str | None:
        return self.alerts.get(receiver, {}).get(diagnosis)

    def all_kept(self, receiver: str) -> dict[str, str]:
        return dict(self.alerts.get(receiver, {}))


class AlertmanagerClient:
    """The Alertmanager receivers of a worker: send one step's alert, resend the kept ones."""

    def __init__(
        self,
        receivers: Iterable[Receiver],
        alerts: ActiveAlerts,
        external_url: str = "",
        post: PostWithHeaders | None = None,
    ) -> None:
        self.receivers = {r.name: r for r in receivers if r.kind == "alertmanager"}
        self._alerts = alerts
        self._external_url = external_url
        self._post = post or _post
        self._next: dict[str, float] = {}  # monotonic time of each receiver's next resend

    def alert(
        self,
        receiver: Receiver,
        diagnosis: Diagnosis,
        subject: str,
        now_ns: int,
        earlier: Sequence[StepSummary] = (),
        escalation_nodes: Sequence[str] = (),
        partition: int = 0,
    ) -> Kept:
        """The alert of one step, its finding read from ``partition`` of the diagnosis topic;
        a resolution takes the label set its firing alert was kept with, so that it ends that
        alert whatever its own suspects say."""
        fired = None
        if diagnosis.state == "resolved":
            text = self._alerts.kept(receiver.name, diagnosis.id)
            fired = Kept.from_json(text) if text is not None else None
        return kept_for(
            diagnosis,
            subject,
            now_ns,
            earlier,
            escalation_nodes,
            self._external_url,
            fired,
            partition,
        )

    def body(self, receiver: Receiver, alerts: Sequence[Kept], now_ns: int) -> bytes:
        """The request body: a JSON list of postable alerts."""
        horizon_ns = int(receiver.resend_s * HORIZON_PERIODS * 1e9)
        return orjson.dumps([kept.alert(now_ns, horizon_ns) for kept in alerts])

    def send(self, receiver: Receiver, diagnosis: Diagnosis, kept: Kept, now_ns: int) -> Answer:
        """Keep the alert (a firing one before posting it), post it, keep or forget it by the
        answer; a Redis failure propagates (`StateUnavailable`: the worker retries)."""
        name, ident = receiver.name, diagnosis.id
        if kept.resolved_ns is None:
            self._alerts.keep(name, ident, kept.to_json())
        answer = self._post(
            alerts_url(receiver.url),
            self.body(receiver, [kept], now_ns),
            receiver.timeout_s,
            auth_headers(receiver),
        )
        if answer.ok or not answer.retryable:
            if kept.resolved_ns is not None or not answer.ok:
                self._alerts.forget(name, ident)
        elif kept.resolved_ns is not None:
            self._alerts.keep(name, ident, kept.to_json())  # resent until it gets through
        return answer

    def resend(self, now_monotonic: float, now_ns: int, owned: Callable[[], Set[int]]) -> None:
        """Housekeeping: post each receiver's kept alerts of the partitions this worker owns
        (``owned``, asked only when a resend is due) once per its ``resend_s``."""
        due = [
            receiver
            for receiver in self.receivers.values()
            if now_monotonic >= self._next.get(receiver.name, 0.0)
        ]
        if not due:
            return
        partitions = owned()
        for receiver in due:
            self._next[receiver.name] = now_monotonic + receiver.resend_s
            self.resend_now(receiver, now_ns, partitions)

    def resend_now(self, receiver: Receiver, now_ns: int, owned: Set[int]) -> int:
        """Post every kept alert of one receiver whose partition is in ``owned``; the number
        delivered. Another worker's alerts are left alone: that worker resends them."""
        kept: list[tuple[str, Kept]] = []
        for ident, text in sorted(self._alerts.all_kept(receiver.name).items()):
            alert = Kept.from_json(text)
            if alert is not None and alert.partition not in owned:
                continue
            ended = alert is not None and alert.resolved_ns is not None
            if alert is None or (ended and alert.since_ns < now_ns - RESOLVED_KEEP_NS):
                self._alerts.forget(receiver.name, ident)
                continue
            kept.append((ident, alert))
        delivered = 0
        for start in range(0, len(kept), BATCH):
            chunk = kept[start : start + BATCH]
            body = self.body(receiver, [alert for _, alert in chunk], now_ns)
            answer = self._post(
                alerts_url(receiver.url), body, receiver.timeout_s, auth_headers(receiver)
            )
            if not answer.ok:
                log.warning(
                    "alertmanager %s: %d alerts not resent: %s",
                    receiver.name,
                    len(chunk),
                    answer.error,
                )
                continue
            delivered += len(chunk)
            for ident, alert in chunk:
                if alert.resolved_ns is not None:
                    self._alerts.forget(receiver.name, ident)
        return delivered

"""c4's findings through a real Alertmanager (Debian's prometheus-alertmanager, v2 API).

The Alertmanager of this module routes every alert, grouped by diagnosis, to a webhook the
test runs; the action worker (real Kafka, real Redis) posts to it beside its own signed
webhook. Shown: a firing finding is in the Alertmanager's API with c4's labels and reaches
the route's receiver; its resolution resolves it; a silence on a node stops the notification
of that node's finding and not another's; c4's own webhook gets them all; an Alertmanager
that is down gets the post retried, then dead-lettered, the worker going on, and the kept
alert is resent once it is back.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from actions.webhook import SIGNATURE_HEADER, verify
from c4.settings import Settings
from c4.stack.alertmanager import (
    alertmanager_down,
    alertmanager_status,
    alertmanager_up,
    alertmanager_url,
    render_alertmanager_config,
)
from schemas.codec import decode
from schemas.messages import Action, Deadletter
from tests.integration.actions_harness import (
    SECRET,
    Cluster,
    HttpReceiver,
    config,
    diagnosis,
    free_port,
    wait_for,
    worker,
)

pytestmark = pytest.mark.integration

FAST = {"tries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2}
GROUP_INTERVAL_S = 1.0


@dataclass
class LocalAlertmanager:
    """The module's Alertmanager and the webhook its route notifies (at ``/am``)."""

    settings: Settings
    notifications: HttpReceiver

    @property
    def url(self) -> str:
        return alertmanager_url(self.settings)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else orjson.dumps(body)
        request = urllib.request.Request(self.url + path, data=data, method=method)  # noqa: S310
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - local http
            text = answer.read()
        return orjson.loads(text) if text else None

    def alerts(self, diagnosis_id: str) -> list[dict[str, Any]]:
        """The Alertmanager's alerts of one diagnosis (active, silenced or inhibited)."""
        found = self._call("GET", f"/api/v2/alerts?filter=diagnosis%3D%22{diagnosis_id}%22")
        return list(found)

    def silence(self, name: str, value: str) -> str:
        """Silence every alert whose label ``name`` is ``value`` for an hour; its id."""
        now = datetime.now(UTC)
        body = {
            "matchers": [{"name": name, "value": value, "isRegex": False, "isEqual": True}],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "c4 tests",
            "comment": f"{value} under maintenance",
        }
        return str(self._call("POST", "/api/v2/silences", body)["silenceID"])

    def expire(self, silence_id: str) -> None:
        self._call("DELETE", f"/api/v2/silence/{silence_id}")

    def notified(self, diagnosis_id: str, status: str) -> list[dict[str, Any]]:
        """The alerts of one diagnosis in the route's notifications, with a status."""
        return [
            alert
            for request in self.notifications.at("/am")
            for alert in request.json()["alerts"]
            if alert["labels"].get("diagnosis") == diagnosis_id and alert["status"] == status
        ]


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAlertmanager]:
    """A real Alertmanager for this module on a port of its own, installed when missing;
    every alert grouped by diagnosis and routed at once to a webhook of the test."""
    notifications = HttpReceiver()
    settings = Settings(
        stack_dir=tmp_path_factory.mktemp("alertmanager"), stack_alertmanager_port=free_port()
    )
    text = render_alertmanager_config(
        [notifications.url("/am")],
        group_by=["diagnosis"],
        group_wait_s=0,
        group_interval_s=GROUP_INTERVAL_S,
        repeat_interval_s=3600,
    )
    try:
        status = alertmanager_up(settings, text)
        assert status.state == "running", status
        again = alertmanager_up(settings, text)
        assert (again.pid, again.detail) == (status.pid, "already running")
        yield LocalAlertmanager(settings, notifications)
    finally:
        stopped = alertmanager_down(settings)
        notifications.close()
    assert stopped.state in {"stopped"}
    assert alertmanager_status(settings).state == "stopped"


def alertmanager_config(
    receiver: HttpReceiver, url: str, resend_s: float = 60.0, **extra: Any
) -> dict[str, Any]:
    """The worker's configuration: c4's signed webhook ``oncall`` and the Alertmanager ``am``."""
    data = config(receiver, external_url="http://c4.example/actions", **extra)
    data["receivers"].append(
        {
            "name": "am",
            "kind": "alertmanager",
            "url": url,
            "timeout_s": 2,
            "resend_s": resend_s,
            "retry": FAST,
        }
    )
    return data


def by_receiver(actions: list[Action], diagnosis_id: str, state: str) -> dict[str, Action]:
    return {
        str(a.detail["receiver"]): a
        for a in actions
        if a.diagnosis == diagnosis_id and a.action == "alert" and a.detail.get("state") == state
    }


def signed(receiver: HttpReceiver, diagnosis_id: str) -> list[str]:
    """The statuses of c4's own (signed, verified) webhook posts about one diagnosis."""
    found = []
    for request in receiver.at("/alert"):
        assert verify(SECRET.encode(), request.body, request.headers[SIGNATURE_HEADER])
        body = request.json()
        if body["groupLabels"]["diagnosis"] == diagnosis_id:
            found.append(body["status"])
    return found


def test_a_finding_fires_in_alertmanager_reaches_its_route_and_resolves(
    cluster: Cluster, receiver: HttpReceiver, alertmanager: LocalAlertmanager
) -> None:
    ident = f"d-am-{cluster.unique}"
    firing = diagnosis(ident, "job-am", [("gpu", "node-005/gpu3", 0.93)], cls="comm_hang")
    resolved = {**firing, "state": "resolved", "ts_ns": time.time_ns() - 10**9}
    with worker(cluster, alertmanager_config(receiver, alertmanager.url)):
        cluster.send("diagnosis", firing, key="job-am")
        [alert] = wait_for(lambda: alertmanager.alerts(ident), what="the alert in Alertmanager")
        routed = wait_for(
            lambda: alertmanager.notified(ident, "firing"), what="the route's firing notification"
        )
        actions = cluster.wait_actions(2)
        cluster.send("diagnosis", resolved, key="job-am")
        ended = wait_for(
            lambda: alertmanager.notified(ident, "resolved"), what="the resolved notification"
        )
        actions = cluster.wait_actions(4)
        after = alertmanager.alerts(ident)

    assert alert["labels"] == {
        "alertname": "C4CommHang",
        "class": "comm_hang",
        "training_job": "job-am",
        "diagnosis": ident,
        "severity": "critical",
        "suspect": "node-005/gpu3",
        "suspect_type": "gpu",
        "node": "node-005",
        "Hostname": "node-005",
        "gpu": "3",
        "device": "nvidia3",
    }
    assert alert["status"]["state"] == "active"
    assert alert["receivers"] == [{"name": "c4-webhooks"}]
    assert alert["startsAt"].startswith("2024-12-02T09:00:00")
    assert alert["generatorURL"] == "http://c4.example/actions"
    ends = datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00"))
    assert timedelta(minutes=3) < ends - datetime.now(UTC) <= timedelta(minutes=4)  # 4 x 60 s
    annotations = alert["annotations"]
    assert annotations["summary"] == "comm_hang in job-am: suspect node-005/gpu3"
    assert annotations["score"] == "0.93"
    assert "Evidence: comm=c0, seq=1001, waiting_ranks=14." in annotations["description"]

    assert len(routed) == 1
    assert routed[0]["labels"] == alert["labels"]
    assert routed[0]["fingerprint"] == alert["fingerprint"]
    assert [e["fingerprint"] for e in ended] == [alert["fingerprint"]]
    assert after == []  # resolved: no longer among the Alertmanager's alerts

    assert {r: a.status for r, a in by_receiver(actions, ident, "firing").items()} == {
        "oncall": "done",
        "am": "done",
    }
    assert {r: a.status for r, a in by_receiver(actions, ident, "resolved").items()} == {
        "oncall": "done",
        "am": "done",
    }
    assert signed(receiver, ident) == ["firing", "resolved"]
    assert cluster.state.alerts.all_kept("am") == {}


def test_a_silence_on_a_node_stops_its_notification_and_not_another_nodes(
    cluster: Cluster, receiver: HttpReceiver, alertmanager: LocalAlertmanager
) -> None:
    quiet, loud = f"d-quiet-{cluster.unique}", f"d-loud-{cluster.unique}"
    silence = alertmanager.silence("node", "node-006")
    try:
        with worker(cluster, alertmanager_config(receiver, alertmanager.url)):
            on_silenced = diagnosis(quiet, "job-s", [("gpu", "node-006/gpu0", 0.9)], "comm_hang")
            elsewhere = diagnosis(loud, "job-s", [("node", "node-007", 0.9)], "comm_hang")
            cluster.send("diagnosis", on_silenced, key="job-s")
            cluster.send("diagnosis", elsewhere, key="job-s")
            wait_for(lambda: alertmanager.notified(loud, "firing"), what="the other node's alert")
            [held] = wait_for(lambda: alertmanager.alerts(quiet), what="the silenced alert")
            time.sleep(3 * GROUP_INTERVAL_S)  # a few flushes of the silenced alert's group
            wait_for(lambda: len(signed(receiver, loud)) == 1, what="c4's own webhook post")
    finally:
        alertmanager.expire(silence)

    assert held["status"] == {"state": "suppressed", "silencedBy": [silence], "inhibitedBy": []}
    assert held["labels"]["node"] == "node-006"
    assert alertmanager.notified(quiet, "firing") == []
    assert len(alertmanager.notified(loud, "firing")) == 1
    # c4's own signed webhook is not Alertmanager's to silence: it got both findings.
    assert signed(receiver, quiet) == ["firing"]
    assert signed(receiver, loud) == ["firing"]


def test_alertmanager_down_retries_dead_letters_goes_on_and_resends_once_back(
    cluster: Cluster, receiver: HttpReceiver, alertmanager: LocalAlertmanager
) -> None:
    lost, later = f"d-down-{cluster.unique}", f"d-next-{cluster.unique}"
    receiver.scripts["/picky/api/v2/alerts"] = [400]
    receiver.scripts["/flaky/api/v2/alerts"] = [503, 429]
    data = alertmanager_config(receiver, alertmanager.url, resend_s=1)
    data["receivers"] += [
        {"name": "picky", "kind": "alertmanager", "url": receiver.url("/picky"), "retry": FAST},
        {"name": "flaky", "kind": "alertmanager", "url": receiver.url("/flaky/"), "retry": FAST},
    ]
    assert alertmanager_down(alertmanager.settings).state == "stopped"
    try:
        with worker(cluster, data, housekeeping=True):
            message = diagnosis(lost, None, [("port", "node-008/mlx5_0:1", 0.9)], cls="link_down")
            cluster.send("diagnosis", message, key="fabric")
            letters = wait_for(
                lambda: len(found := cluster.messages("deadletter")) >= 2 and found,
                what="the dead letters",
            )
            # The worker goes on: the next finding is handled while the Alertmanager is down.
            nxt = diagnosis(later, "job-n", [("node", "node-009", 0.9)], cls="comm_slow")
            cluster.send("diagnosis", nxt, key="job-n")
            wait_for(lambda: signed(receiver, later) == ["firing"], what="the next finding")
            actions = cluster.actions()
            assert alertmanager_up(alertmanager.settings).state == "running"
            # The kept alerts are resent (every resend_s) and reach it once it is back.
            [back] = wait_for(lambda: alertmanager.alerts(lost), what="the resent alert")
            first_end = back["endsAt"]
            wait_for(
                lambda: (
                    alertmanager.alerts(later)
                    and alertmanager.alerts(lost)[0]["endsAt"] > first_end
                ),
                what="a later resend moving endsAt on",
            )
    finally:
        alertmanager_up(alertmanager.settings)

    down = by_receiver(actions, lost, "firing")
    assert down["am"].status == "failed"
    assert down["am"].detail["reason"] == "receiver_unavailable"
    assert down["am"].detail["tries"] == 3
    assert str(down["am"].detail["message"]).startswith("alertmanager am: cannot connect")
    assert (down["picky"].status, down["picky"].detail["reason"]) == ("failed", "receiver_rejected")
    assert "tries" not in down["picky"].detail
    picky = [r.json() for r in receiver.at("/picky/api/v2/alerts")]
    assert [a["labels"]["diagnosis"] for body in picky for a in body].count(lost) == 1
    assert (down["flaky"].status, down["flaky"].detail["tries"]) == ("done", 3)
    assert down["oncall"].status == "done"
    decoded = [decode(value, "deadletter") for value in letters]
    topics = sorted(d.topic for d in decoded if isinstance(d, Deadletter))
    assert topics == ["alertmanager:am", "alertmanager:picky"]
    letter = next(d for d in decoded if isinstance(d, Deadletter) and d.topic == "alertmanager:am")
    assert letter.error.startswith("alertmanager am: cannot connect")
    [posted] = orjson.loads(letter.payload)
    assert posted["labels"]["alertname"] == "C4LinkDown"
    assert (posted["labels"]["device"], posted["labels"]["port"]) == ("mlx5_0", "1")
    assert back["labels"] == posted["labels"]
    assert set(cluster.state.alerts.all_kept("am")) == {lost, later}
    assert set(cluster.state.alerts.all_kept("picky")) == {later}  # a rejected one is not kept

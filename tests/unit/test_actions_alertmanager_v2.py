"""Alerts for an Alertmanager's v2 API: labels, CamelCase alertname, startsAt/endsAt rules, the
kept alert, the client (keep, forget, resend, auth) and the alert executor's dispatch."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, get_args

import orjson
import pytest

from actions.config import ConfigError, Receiver, WorkerConfig, parse_config
from actions.drivers.alertmanager.client import RESOLVED_KEEP_NS, AlertmanagerClient, MemoryAlerts
from actions.drivers.alertmanager.executor import AlertExecutor
from actions.drivers.alertmanager.payload import rfc3339
from actions.drivers.alertmanager.v2 import (
    Kept,
    alertname,
    alerts_url,
    annotations_for,
    kept_for,
    labels_for,
    place_labels,
)
from actions.pipeline.executor import Context
from actions.pipeline.outcome import Reason, StepSummary
from actions.pipeline.policy import Step, View, plan
from actions.pipeline.step_stages import run_with_retry
from actions.state.model import Claim
from actions.webhook import Answer
from schemas.messages import Deadletter, Diagnosis, DiagnosisClass
from streams.metrics import FINDING_LABELS

ONSET = 1_733_130_000_000_000_000  # 2024-12-02T09:00:00Z
NOW = ONSET + 3600 * 10**9
S = 10**9


def diagnosis(
    suspects: list[tuple[str, str, float]],
    cls: str = "noncomm_hang",
    job: str | None = "job-42",
    state: str = "firing",
    ts_ns: int = ONSET + 12 * S,
) -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": "d-5c1e",
            "job": job,
            "state": state,
            "class": cls,
            "onset_ns": ONSET,
            "ts_ns": ts_ns,
            "suspects": [{"type": t, "id": i, "score": s} for t, i, s in suspects],
            "evidence": {"comm": "7f3a9c", "rank": 3, "median_lag_ms": 41.0},
        }
    )


GPU = [("gpu", "node-001/gpu3", 0.97), ("node", "node-002", 0.4)]


# --- the payload --------------------------------------------------------------------------


def test_alertname_is_c4_and_the_class_in_camel_case() -> None:
    assert alertname("noncomm_hang") == "C4NoncommHang"
    assert alertname("gpu_fault") == "C4GpuFault"
    assert alertname("ranks_missing") == "C4RanksMissing"
    names = {alertname(cls) for cls in get_args(DiagnosisClass)}
    assert len(names) == len(get_args(DiagnosisClass))
    assert all(name.isidentifier() and name.startswith("C4") for name in names)


def test_labels_of_a_gpu_suspect_join_the_dcgm_exporters() -> None:
    assert labels_for(diagnosis(GPU), "node-001/gpu3") == {
        "alertname": "C4NoncommHang",
        "class": "noncomm_hang",
        "training_job": "job-42",
        "diagnosis": "d-5c1e",
        "severity": "critical",
        "suspect": "node-001/gpu3",
        "suspect_type": "gpu",
        "node": "node-001",
        "Hostname": "node-001",
        "gpu": "3",
        "device": "nvidia3",
    }


@pytest.mark.parametrize(
    ("kind", "ident", "expected"),
    [
        ("node", "node-003", {"node": "node-003", "Hostname": "node-003"}),
        (
            "port",
            "node-003/mlx5_0:1",
            {"node": "node-003", "Hostname": "node-003", "device": "mlx5_0", "port": "1"},
        ),
        # A port's own cable is named by the port.
        (
            "link",
            "node-003/mlx5_1:2",
            {"node": "node-003", "Hostname": "node-003", "device": "mlx5_1", "port": "2"},
        ),
        ("port", "node-003/ib0", {"node": "node-003", "Hostname": "node-003", "device": "ib0"}),
        ("link", "leaf-0a~spine-0", {}),
        ("switch", "spine-3", {}),
        ("rank", "job-42/rank3", {}),
        ("gpu", "node-003/gpuX", {"node": "node-003", "Hostname": "node-003"}),
    ],
)
def test_where_a_suspect_sits(kind: str, ident: str, expected: dict[str, str]) -> None:
    assert place_labels(kind, ident) == expected


def test_severity_follows_the_class_and_fabric_findings_have_no_training_job() -> None:
    slow = labels_for(diagnosis(GPU, cls="noncomm_slow"), "node-001/gpu3")
    assert (slow["alertname"], slow["severity"]) == ("C4NoncommSlow", "warning")
    link = diagnosis([("link", "leaf-0a~spine-0", 0.9)], cls="link_degraded", job=None)
    found = labels_for(link, "leaf-0a~spine-0")
    # As on the alert Prometheus fires from the finding's series (training_job="": none).
    assert "training_job" not in found and "job" not in found
    assert (found["suspect"], found["suspect_type"]) == ("leaf-0a~spine-0", "link")
    assert "node" not in found
    assert annotations_for(link, "leaf-0a~spine-0")["summary"].startswith("link_degraded in fabric")


def test_the_labels_are_named_as_on_the_findings_prometheus_alerts_on() -> None:
    # One route or silence matches a finding's alert from the worker and from c4-rules.yml:
    # each label naming what a c4_finding_open label names has its name (training_job, not
    # job, which is the scrape job's on the rules' alerts).
    escalated = labels_for(diagnosis(GPU), "leaf-0a", escalation=True)
    for found in (labels_for(diagnosis(GPU), "node-001/gpu3"), escalated):
        assert set(found) - {"alertname", "severity", "escalation"} <= set(FINDING_LABELS)
        assert found["training_job"] == "job-42" and "job" not in found


def test_an_alert_fired_with_the_old_job_label_resolves_with_it() -> None:
    # Kept by a worker from before the rename: resent and resolved under the label set it
    # fired with, so that the Alertmanager ends that alert and not another.
    alerts = MemoryAlerts()
    posts = Posts()
    receiver, am = client(posts, alerts)
    old = kept_for(diagnosis(GPU), "node-001/gpu3", NOW)
    labels = {("job" if name == "training_job" else name): v for name, v in old.labels.items()}
    alerts.keep("am", "d-5c1e", Kept(labels, old.annotations, old.starts_ns).to_json())
    assert am.resend_now(receiver, NOW + S, {0}) == 1
    resolved = diagnosis(GPU, state="resolved", ts_ns=NOW + 2 * S)
    ended = am.alert(receiver, resolved, "node-001/gpu3", NOW + 3 * S)
    assert am.send(receiver, resolved, ended, NOW + 3 * S).ok
    assert [call[1][0]["labels"] for call in posts.calls] == [labels, labels]
    assert posts.calls[-1][1][0]["endsAt"] == rfc3339(NOW + 2 * S)


def test_no_suspect_no_suspect_labels_and_an_escalation_names_its_switch() -> None:
    bare = labels_for(diagnosis([], cls="comm_hang"), "job-42")
    assert "suspect" not in bare
    assert "suspect_type" not in bare
    nodes = [("node", f"node-00{i}", 0.8) for i in range(5)]
    escalated = labels_for(diagnosis(nodes, cls="comm_slow"), "leaf-0a", escalation=True)
    assert escalated["severity"] == "critical"
    assert escalated["escalation"] == "blast_radius"
    assert (escalated["suspect"], escalated["suspect_type"]) == ("leaf-0a", "switch")
    no_switch = labels_for(diagnosis(nodes), "job-42", escalation=True)
    assert "suspect" not in no_switch


def test_annotations_carry_summary_description_evidence_score_and_actions() -> None:
    earlier = (StepSummary("isolate", "node-001", "done"),)
    notes = annotations_for(diagnosis(GPU), "node-001/gpu3", earlier)
    assert notes["summary"] == "noncomm_hang in job-42: suspect node-001/gpu3"
    assert notes["score"] == "0.97"
    assert notes["suspects"] == "node-001/gpu3 (0.97), node-002 (0.40)"
    assert orjson.loads(notes["evidence"])["median_lag_ms"] == 41.0
    assert notes["actions"] == "isolate node-001: done"
    assert notes["description"].splitlines() == [
        "c4 diagnosis d-5c1e: noncomm_hang in job-42, since 2024-12-02T09:00:00.000Z"
        " (concluded 2024-12-02T09:00:12.000Z).",
        "Suspects: node-001/gpu3 (0.97), node-002 (0.40).",
        "Evidence: comm=7f3a9c, median_lag_ms=41.0, rank=3.",
        "Actions: isolate node-001: done.",
    ]
    assert all(isinstance(value, str) for value in notes.values())
    escalated = annotations_for(diagnosis(GPU), "leaf-0a", (), ["node-001", "node-002"])
    assert escalated["nodes"] == "node-001, node-002"
    assert escalated["summary"].startswith("2 nodes of job-42 suspected at once")


def test_a_firing_alert_starts_at_onset_and_ends_a_horizon_ahead() -> None:
    kept = kept_for(diagnosis(GPU), "node-001/gpu3", NOW, external_url="http://c4/x")
    alert = kept.alert(NOW, 240 * S)
    assert alert["startsAt"] == "2024-12-02T09:00:00.000Z"
    assert alert["endsAt"] == rfc3339(NOW + 240 * S)
    assert alert["generatorURL"] == "http://c4/x"
    assert kept.resolved_ns is None
    later = kept.alert(NOW + 60 * S, 240 * S)  # a resend moves the horizon on
    assert later["endsAt"] == rfc3339(NOW + 300 * S)
    assert later["labels"] == alert["labels"]
    # An onset ahead of the wall clock (a skewed agent) starts now; no URL, no generatorURL.
    future = diagnosis(GPU).model_copy(update={"onset_ns": NOW + 10 * S, "ts_ns": NOW + 20 * S})
    ahead = kept_for(future, "node-001/gpu3", NOW).alert(NOW, 240 * S)
    assert ahead["startsAt"] == rfc3339(NOW)
    assert "generatorURL" not in ahead


def test_a_resolved_alert_ends_at_its_resolution_never_in_the_future() -> None:
    resolved = diagnosis(GPU, state="resolved", ts_ns=ONSET + 90 * S)
    alert = kept_for(resolved, "node-001/gpu3", NOW).alert(NOW, 240 * S)
    assert (alert["startsAt"], alert["endsAt"]) == (rfc3339(ONSET), rfc3339(ONSET + 90 * S))
    ahead = diagnosis(GPU, state="resolved", ts_ns=NOW + 30 * S)
    assert kept_for(ahead, "node-001/gpu3", NOW).alert(NOW, 240 * S)["endsAt"] == rfc3339(NOW)


def test_a_resolution_ends_the_alert_that_fired_with_its_labels_and_start() -> None:
    nodes = [("node", f"node-00{i}", 0.8) for i in range(5)]
    fired = kept_for(diagnosis(nodes), "leaf-0a", NOW - 60 * S, (), ["node-000", "node-001"])
    resolved = diagnosis([("node", "node-000", 0.3)], state="resolved", ts_ns=NOW - S)
    ended = kept_for(resolved, "node-000", NOW, fired=fired)
    assert ended.labels == fired.labels  # the escalation's label set, not the new suspect's
    assert ended.starts_ns == fired.starts_ns
    assert ended.resolved_ns == NOW - S
    assert ended.annotations["nodes"] == "node-000, node-001"
    assert ended.annotations["summary"] == "noncomm_hang in job-42: suspect node-000"


def test_kept_alerts_read_back_and_garbage_reads_as_none() -> None:
    kept = kept_for(diagnosis(GPU, state="resolved"), "node-001/gpu3", NOW, external_url="u")
    assert Kept.from_json(kept.to_json()) == kept
    for text in ("", "[]", "{}", '{"labels": 3}', "not json"):
        assert Kept.from_json(text) is None


def test_the_alerts_url_keeps_a_route_prefix() -> None:
    assert alerts_url("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert alerts_url("https://am.example/prefix/") == "https://am.example/prefix/api/v2/alerts"


# --- the client ---------------------------------------------------------------------------


class Posts:
    """A fake Alertmanager: answers from a script (then 200) and records what it got."""

    def __init__(self, *statuses: int | None, alerts: MemoryAlerts | None = None) -> None:
        self.script = list(statuses)
        self.calls: list[tuple[str, list[dict[str, Any]], dict[str, str]]] = []
        self.kept_when_posted: list[dict[str, str]] = []
        self._alerts = alerts

    def __call__(
        self, url: str, body: bytes, timeout_s: float, headers: Mapping[str, str]
    ) -> Answer:
        del timeout_s
        self.calls.append((url, orjson.loads(body), dict(headers)))
        if self._alerts is not None:
            self.kept_when_posted.append(self._alerts.all_kept("am"))
        status = self.script.pop(0) if self.script else 200
        if status is None:
            return Answer(None, "cannot connect: [Errno 111] Connection refused")
        return Answer(status, "" if status < 300 else f"HTTP {status}")


def config(**receiver: Any) -> WorkerConfig:
    data = {"name": "am", "kind": "alertmanager", "url": "http://am:9093", **receiver}
    env = {"AM_TOKEN": "t0ken", "AM_PASSWORD": "pa55"}
    return parse_config({"receivers": [data], "external_url": "http://c4/"}, env)


def client(
    posts: Posts, alerts: MemoryAlerts, **receiver: Any
) -> tuple[Receiver, AlertmanagerClient]:
    settings = config(**receiver)
    made = AlertmanagerClient(settings.receivers, alerts, settings.external_url, posts)
    return settings.receivers[0], made


def test_a_firing_alert_is_kept_before_it_is_posted_and_stays_kept() -> None:
    alerts = MemoryAlerts()
    posts = Posts(alerts=alerts)
    receiver, am = client(posts, alerts)
    firing = diagnosis(GPU)
    answer = am.send(receiver, firing, am.alert(receiver, firing, "node-001/gpu3", NOW), NOW)
    assert answer.ok
    [(url, body, headers)] = posts.calls
    assert url == "http://am:9093/api/v2/alerts"
    assert headers == {}
    assert body[0]["endsAt"] == rfc3339(NOW + 4 * 60 * S)  # 4 x resend_s (60 s)
    assert body[0]["generatorURL"] == "http://c4/"
    assert list(posts.kept_when_posted[0]) == ["d-5c1e"]
    assert list(alerts.all_kept("am")) == ["d-5c1e"]


@pytest.mark.parametrize(("status", "kept"), [(503, True), (None, True), (429, True), (400, False)])
def test_a_firing_alert_not_delivered_stays_kept_unless_rejected(
    status: int | None, kept: bool
) -> None:
    alerts = MemoryAlerts()
    receiver, am = client(Posts(status), alerts)
    firing = diagnosis(GPU)
    answer = am.send(receiver, firing, am.alert(receiver, firing, "node-001/gpu3", NOW), NOW)
    assert not answer.ok
    assert bool(alerts.all_kept("am")) is kept


def test_a_resolution_uses_the_kept_labels_and_is_forgotten_once_delivered() -> None:
    alerts = MemoryAlerts()
    posts = Posts(None)
    receiver, am = client(posts, alerts)
    firing = diagnosis(GPU)
    am.send(receiver, firing, am.alert(receiver, firing, "node-001/gpu3", NOW), NOW)
    # The resolution names another suspect first: it still ends the alert that fired.
    resolved = diagnosis(GPU[::-1], state="resolved", ts_ns=NOW + S)
    ended = am.alert(receiver, resolved, "node-002", NOW + 2 * S)
    assert ended.labels["suspect"] == "node-001/gpu3"
    assert am.send(receiver, resolved, ended, NOW + 2 * S).ok
    assert posts.calls[-1][1][0]["endsAt"] == rfc3339(NOW + S)
    assert alerts.all_kept("am") == {}


def test_an_undelivered_resolution_is_resent_until_it_gets_through() -> None:
    alerts = MemoryAlerts()
    posts = Posts(200, 503, 500, 200)
    receiver, am = client(posts, alerts)
    firing, resolved = diagnosis(GPU), diagnosis(GPU, state="resolved", ts_ns=NOW + S)
    am.send(receiver, firing, am.alert(receiver, firing, "node-001/gpu3", NOW), NOW)
    later = NOW + 2 * S
    assert not am.send(receiver, resolved, am.alert(receiver, resolved, "x", later), later).ok
    kept = Kept.from_json(alerts.all_kept("am")["d-5c1e"])
    assert kept is not None
    assert kept.resolved_ns == NOW + S
    assert am.resend_now(receiver, NOW + 10 * S, {0}) == 0  # 500: still kept
    assert am.resend_now(receiver, NOW + 20 * S, {0}) == 1
    assert posts.calls[-1][1][0]["endsAt"] == rfc3339(NOW + S)
    assert alerts.all_kept("am") == {}


def test_resend_posts_every_kept_alert_once_per_resend_period_with_a_new_horizon() -> None:
    alerts = MemoryAlerts()
    posts = Posts()
    receiver, am = client(posts, alerts, resend_s=30)
    for ident, node in (("d-1", "node-001"), ("d-2", "node-002")):
        found = diagnosis([("node", node, 0.9)]).model_copy(update={"id": ident})
        am.send(receiver, found, am.alert(receiver, found, node, NOW), NOW)
    alerts.keep("am", "d-junk", "not an alert")
    posts.calls.clear()
    asked: list[float] = []

    def owned() -> set[int]:
        asked.append(len(posts.calls))
        return {0}

    am.resend(100.0, NOW + 5 * S, owned)
    am.resend(110.0, NOW + 15 * S, owned)  # not due yet: the assignment is not even asked
    am.resend(130.0, NOW + 35 * S, owned)
    assert len(posts.calls) == 2
    assert asked == [0, 1]
    first, second = posts.calls[0][1], posts.calls[1][1]
    assert [a["labels"]["diagnosis"] for a in first] == ["d-1", "d-2"]
    assert {a["endsAt"] for a in first} == {rfc3339(NOW + 5 * S + 120 * S)}
    assert {a["endsAt"] for a in second} == {rfc3339(NOW + 35 * S + 120 * S)}
    assert set(alerts.all_kept("am")) == {"d-1", "d-2"}  # the unreadable one is dropped


def test_each_worker_resends_only_the_alerts_of_the_partitions_it_owns() -> None:
    # Two workers of one group share the kept alerts (Redis): each resends those whose finding
    # came on a partition it owns, so every alert has one sender, not one per worker.
    alerts = MemoryAlerts()
    first_posts, second_posts = Posts(), Posts()
    receiver, first = client(first_posts, alerts)
    _, second = client(second_posts, alerts)
    for ident, partition in (("d-0", 0), ("d-1", 1), ("d-2", 1)):
        found = diagnosis(GPU).model_copy(update={"id": ident})
        kept = first.alert(receiver, found, "node-001/gpu3", NOW, partition=partition)
        first.send(receiver, found, kept, NOW)
    kept_on = {
        i: getattr(Kept.from_json(t), "partition", None) for i, t in alerts.all_kept("am").items()
    }
    assert kept_on == {"d-0": 0, "d-1": 1, "d-2": 1}
    first_posts.calls.clear()
    assert first.resend_now(receiver, NOW + 30 * S, {0}) == 1
    assert second.resend_now(receiver, NOW + 30 * S, {1}) == 2
    assert second.resend_now(receiver, NOW + 60 * S, set()) == 0  # owns none: sends none
    sent_by_first = [a["labels"]["diagnosis"] for _, body, _ in first_posts.calls for a in body]
    sent_by_second = [a["labels"]["diagnosis"] for _, body, _ in second_posts.calls for a in body]
    assert (sent_by_first, sent_by_second) == (["d-0"], ["d-1", "d-2"])
    # A resolution is kept (until delivered) under the partition its record came on.
    resolved = diagnosis(GPU, state="resolved").model_copy(update={"id": "d-1"})
    ended = second.alert(receiver, resolved, "node-001/gpu3", NOW + 61 * S, partition=1)
    second_posts.script = [503]
    assert not second.send(receiver, resolved, ended, NOW + 61 * S).ok
    assert first.resend_now(receiver, NOW + 90 * S, {0}) == 1
    assert second.resend_now(receiver, NOW + 90 * S, {1}) == 2
    assert set(alerts.all_kept("am")) == {"d-0", "d-2"}


def test_an_alert_kept_without_a_partition_is_partition_zeros() -> None:
    # Kept by a worker from before partitions were kept: one owner resends it, not every one.
    kept = kept_for(diagnosis(GPU), "node-001/gpu3", NOW)
    text = orjson.loads(kept.to_json())
    del text["partition"]
    read = Kept.from_json(orjson.dumps(text).decode())
    assert read is not None and read.partition == 0
    moved = kept_for(diagnosis(GPU), "node-001/gpu3", NOW, partition=5)
    assert Kept.from_json(moved.to_json()) == moved


def test_an_old_undelivered_resolution_is_dropped() -> None:
    alerts = MemoryAlerts()
    posts = Posts()
    receiver, am = client(posts, alerts)
    resolved = kept_for(diagnosis(GPU, state="resolved"), "node-001/gpu3", NOW)
    alerts.keep("am", "d-5c1e", resolved.to_json())
    assert am.resend_now(receiver, NOW + RESOLVED_KEEP_NS + S, {0}) == 0
    assert posts.calls == []
    assert alerts.all_kept("am") == {}


def test_bearer_token_and_basic_auth_come_from_the_environment() -> None:
    alerts = MemoryAlerts()
    posts = Posts()
    receiver, am = client(posts, alerts, bearer_token_env="AM_TOKEN")  # noqa: S106 - its name
    firing = diagnosis(GPU)
    am.send(receiver, firing, am.alert(receiver, firing, "node-001/gpu3", NOW), NOW)
    assert posts.calls[-1][2] == {"Authorization": "Bearer t0ken"}
    auth = {"username": "c4", "password_env": "AM_PASSWORD"}
    receiver, am = client(posts, alerts, basic_auth=auth)
    am.send(receiver, firing, am.alert(receiver, firing, "node-001/gpu3", NOW), NOW)
    token = base64.b64encode(b"c4:pa55").decode()
    assert posts.calls[-1][2] == {"Authorization": f"Basic {token}"}
    assert {s.get_secret_value() for s in receiver.secrets()} == {"pa55"}
    assert "pa55" not in repr(receiver)


# --- the executor -------------------------------------------------------------------------


def context(found: Diagnosis) -> Context:
    return Context(found, Claim("k", "1"), (), "test", NOW)


def test_the_alert_executor_posts_to_an_alertmanager_retries_and_dead_letters() -> None:
    alerts = MemoryAlerts()
    posts = Posts(503, None, None, 400)
    settings = config(retry={"tries": 3, "backoff_s": 0})
    am = AlertmanagerClient(settings.receivers, alerts, settings.external_url, posts)
    letters: list[tuple[Deadletter, str]] = []
    webhook_letters: list[tuple[Deadletter, str]] = []
    executor = AlertExecutor(
        settings,
        lambda letter, key: webhook_letters.append((letter, key)),
        alertmanagers=am,
        alertmanager_letter=lambda letter, key: letters.append((letter, key)),
    )
    step = Step("alert", "node-001/gpu3", "diagnosis", receiver="am")
    found = context(diagnosis(GPU))
    backoff = executor.retry_for(step)
    assert backoff is not None
    result = run_with_retry(lambda: executor.execute(step, found), backoff, lambda _: None)
    assert (result.status, result.reason, result.detail["tries"]) == (
        "failed",
        Reason.RECEIVER_UNAVAILABLE,
        3,
    )
    assert result.message == "alertmanager am: cannot connect: [Errno 111] Connection refused"
    executor.give_up(step, result, found)
    [(letter, key)] = letters
    assert (letter.topic, key, webhook_letters) == ("alertmanager:am", "am", [])
    assert orjson.loads(letter.payload)[0]["labels"]["alertname"] == "C4NoncommHang"
    # A 400 is final: one try, and the alert is not kept.
    rejected = run_with_retry(lambda: executor.execute(step, found), backoff, lambda _: None)
    assert (rejected.reason, "tries" in rejected.detail) == (Reason.RECEIVER_REJECTED, False)
    assert alerts.all_kept("am") == {}
    assert len(posts.calls) == 4


# --- the configuration and the policy ----------------------------------------------------


@pytest.mark.parametrize(
    ("receiver", "message"),
    [
        ({"resend_s": 5}, "receivers.0: resend_s is for kind alertmanager only"),
        ({"bearer_token_env": "T"}, "bearer_token_env is for kind alertmanager only"),
        ({"kind": "alertmanager", "secret_env": "K"}, "secret_env signs webhooks"),
        ({"kind": "alertmanager", "states": ["firing"]}, "needs state resolved"),
        (
            {
                "kind": "alertmanager",
                "bearer_token_env": "T",
                "basic_auth": {"username": "u", "password_env": "P"},
            },
            "bearer_token_env and basic_auth exclude each other",
        ),
        ({"kind": "pagerduty"}, "receivers.0.kind: Input should be 'webhook' or 'alertmanager'"),
        ({"kind": "alertmanager", "resend_s": 0.1}, "receivers.0.resend_s: Input should be"),
        (
            {"kind": "alertmanager", "bearer_token_env": "NOT_SET"},
            "receivers[0].bearer_token_env: environment variable NOT_SET is not set",
        ),
        (
            {"kind": "alertmanager", "basic_auth": {"username": "u", "password_env": "NOPE"}},
            "receivers[0].basic_auth.password_env: environment variable NOPE is not set",
        ),
    ],
)
def test_alertmanager_receiver_fields_are_checked(receiver: dict[str, Any], message: str) -> None:
    data = {"name": "a", "url": "http://am:9093", **receiver}
    with pytest.raises(ConfigError) as caught:
        parse_config({"receivers": [data]}, {})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_alertmanager_hears_every_resolution_whatever_its_score_or_the_policy() -> None:
    settings = parse_config(
        {
            "policy": {"classes": {"noncomm_hang": ["isolate"]}},
            "receivers": [
                {"name": "hook", "url": "http://h/", "min_score": 0.9},
                {"name": "am", "kind": "alertmanager", "url": "http://am/", "min_score": 0.9},
            ],
        },
        {},
    )
    [am] = [r for r in settings.receivers if r.kind == "alertmanager"]
    assert am.wants("noncomm_hang", "job-42", "resolved", 0.1)
    assert not am.wants("noncomm_hang", "job-42", "firing", 0.1)
    # A class without alert alerted on a failure only; its resolution still ends that alert.
    resolved = diagnosis([("gpu", "node-001/gpu3", 0.5)], state="resolved")
    steps = plan(resolved, View(), settings).steps
    assert [(s.action, s.receiver, s.conditional) for s in steps] == [("alert", "am", False)]

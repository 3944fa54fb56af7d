"""The Alertmanager webhook payload, Prometheus's fingerprint and the HMAC signature."""

from __future__ import annotations

import hashlib
import hmac

import orjson

from actions.drivers.alertmanager.payload import fingerprint, payload, rfc3339
from actions.pipeline.outcome import StepSummary
from actions.webhook import sign, verify
from schemas.messages import Diagnosis


def diagnosis(state: str = "firing") -> Diagnosis:
    return Diagnosis.model_validate(
        {
            "v": 1,
            "kind": "diagnosis",
            "id": "d-5c1e",
            "job": "job-42",
            "state": state,
            "class": "noncomm_slow",
            "onset_ns": 1733130000000000000,
            "ts_ns": 1733130012000000000,
            "suspects": [{"type": "gpu", "id": "node-001/gpu3", "score": 0.97}],
            "evidence": {"comm": "7f3a9c", "rank": 3, "median_lag_ms": 41.0},
        }
    )


def test_fingerprint_matches_prometheus_label_set_fingerprint() -> None:
    # prometheus/common model: TestMetricToFingerprint's scenarios.
    assert int(fingerprint({}), 16) == 14695981039346656037
    labels = {"name": "garland, briggs", "fear": "love is not enough"}
    assert int(fingerprint(labels), 16) == 5799056148416392346
    assert len(fingerprint(labels)) == 16


def test_firing_payload_has_the_version_4_shape() -> None:
    body = payload(diagnosis(), "oncall", "node-001/gpu3", external_url="http://c4")
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["receiver"] == "oncall"
    assert body["truncatedAlerts"] == 0
    assert body["groupKey"] == '{}:{diagnosis="d-5c1e"}'
    [alert] = body["alerts"]  # type: ignore[misc]
    assert alert["labels"] == {
        "alertname": "C4Diagnosis",
        "class": "noncomm_slow",
        "training_job": "job-42",
        "job": "job-42",  # deprecated, kept for receivers written before training_job
        "suspect": "node-001/gpu3",
        "diagnosis": "d-5c1e",
        "severity": "warning",
    }
    assert alert["startsAt"] == "2024-12-02T09:00:00.000Z"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["fingerprint"] == fingerprint(alert["labels"])
    annotations = alert["annotations"]
    assert orjson.loads(annotations["evidence"]) == {
        "comm": "7f3a9c",
        "rank": 3,
        "median_lag_ms": 41.0,
    }
    assert annotations["evidence_rank"] == "3"
    assert annotations["suspects"] == "node-001/gpu3 (0.97)"
    assert body["commonLabels"] == alert["labels"]
    # Every annotation value is a string, as Alertmanager's are.
    assert all(isinstance(value, str) for value in annotations.values())


def test_resolved_payload_ends_and_keeps_the_fingerprint() -> None:
    firing = payload(diagnosis(), "oncall", "node-001/gpu3")
    resolved = payload(diagnosis("resolved"), "oncall", "node-001/gpu3")
    assert resolved["status"] == "resolved"
    [alert] = resolved["alerts"]  # type: ignore[misc]
    assert alert["endsAt"] == rfc3339(1733130012000000000) == "2024-12-02T09:00:12.000Z"
    assert alert["fingerprint"] == firing["alerts"][0]["fingerprint"]  # type: ignore[index]


def test_a_fabric_wide_finding_has_no_training_job_and_the_old_job_fabric() -> None:
    fabric = diagnosis().model_copy(update={"job": None})
    [alert] = payload(fabric, "oncall", "leaf-0a~spine-0")["alerts"]  # type: ignore[misc]
    assert "training_job" not in alert["labels"]
    assert alert["labels"]["job"] == "fabric"
    assert alert["annotations"]["summary"] == "noncomm_slow in fabric: suspect leaf-0a~spine-0"


def test_a_failed_earlier_step_makes_the_alert_critical_and_is_annotated() -> None:
    earlier = (
        StepSummary("isolate", "node-001", "done"),
        StepSummary("restart", "job-42", "failed", "no_spare", "no spare node left"),
    )
    [alert] = payload(diagnosis(), "oncall", "node-001/gpu3", earlier)["alerts"]  # type: ignore[misc]
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["actions"] == (
        "isolate node-001: done; restart job-42: failed (no_spare: no spare node left)"
    )


def test_escalation_names_the_switch_and_the_nodes() -> None:
    nodes = ("node-000", "node-001", "node-002", "node-003", "node-004")
    [alert] = payload(diagnosis(), "oncall", "leaf-0a", (), nodes)["alerts"]  # type: ignore[misc]
    assert alert["labels"]["alertname"] == "C4Escalation"
    assert alert["labels"]["suspect"] == "leaf-0a"
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["nodes"] == ", ".join(nodes)


def test_signature_is_hmac_sha256_of_the_body() -> None:
    body = b'{"version":"4"}'
    header = sign(b"key", body)
    assert header == "sha256=" + hmac.new(b"key", body, hashlib.sha256).hexdigest()
    assert verify(b"key", body, header)
    assert not verify(b"other", body, header)
    assert not verify(b"key", body + b" ", header)

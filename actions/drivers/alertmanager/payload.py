"""The Alertmanager webhook payload (version "4") for a diagnosis and its fingerprint.

Pure: receivers written for Alertmanager (PagerDuty bridges, chat bots, ticketing hooks) read
these bodies unchanged. The fingerprint is Prometheus's label-set fingerprint (FNV-1a 64 over
the sorted label names and values, each followed by the separator byte 255), so the same
finding fires and resolves under one fingerprint.

The training job is ``training_job`` (none for a fabric-wide finding), as on every other alert
and series of c4 (``job`` is Prometheus's scrape job). ``job`` is still sent, with its old
value (the training job, ``fabric`` for a fabric-wide finding), for receivers written before
the rename: deprecated, to be dropped with the next payload version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import orjson
from pydantic import JsonValue

from actions.pipeline.outcome import StepSummary
from schemas.messages import Diagnosis

VERSION = "4"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1
_SEPARATOR = 255


def fingerprint(labels: Mapping[str, str]) -> str:
    """Prometheus's fingerprint of a label set, 16 hex digits."""
    value = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name.encode(), labels[name].encode()):
            for byte in (*part, _SEPARATOR):
                value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return f"{value:016x}"


def rfc3339(ns: int) -> str:
    """Nanoseconds since the epoch as RFC 3339 UTC with milliseconds."""
    moment = datetime.fromtimestamp(ns / 1e9, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def payload(
    diagnosis: Diagnosis,
    receiver: str,
    subject: str,
    earlier: Sequence[StepSummary] = (),
    escalation_nodes: Sequence[str] = (),
    external_url: str = "",
) -> dict[str, JsonValue]:
    """The webhook body for one diagnosis (one alert, grouped by the diagnosis id)."""
    escalation = bool(escalation_nodes)
    trouble = escalation or any(step.status == "failed" for step in earlier)
    where = diagnosis.job or "fabric"
    labels = {
        "alertname": "C4Escalation" if escalation else "C4Diagnosis",
        "class": diagnosis.class_,
        "job": where,  # deprecated: training_job (see the module docstring)
        "suspect": subject,
        "diagnosis": diagnosis.id,
        "severity": "critical" if trouble else "warning",
    }
    if diagnosis.job is not None:
        labels["training_job"] = diagnosis.job
    suspects = ", ".join(f"{s.id} ({s.score:.2f})" for s in diagnosis.suspects) or "none"
    summary = f"{diagnosis.class_} in {where}: suspect {subject}"
    if escalation:
        summary = (
            f"{len(escalation_nodes)} nodes of {where} suspected at once:"
            f" shared component {subject} escalated, nothing isolated"
        )
    annotations: dict[str, JsonValue] = {
        "summary": summary,
        "suspects": suspects,
        "evidence": orjson.dumps(diagnosis.evidence, option=orjson.OPT_SORT_KEYS).decode(),
    }
    for key, value in sorted(diagnosis.evidence.items()):
        annotations[f"evidence_{key}"] = (
            value if isinstance(value, str) else orjson.dumps(value).decode()
        )
    if earlier:
        annotations["actions"] = "; ".join(step.line() for step in earlier)
    if escalation:
        annotations["nodes"] = ", ".join(escalation_nodes)
    status = diagnosis.state
    alert: dict[str, JsonValue] = {
        "status": status,
        "labels": dict(labels),
        "annotations": annotations,
        "startsAt": rfc3339(diagnosis.onset_ns),
        "endsAt": rfc3339(diagnosis.ts_ns) if status == "resolved" else ZERO_TIME,
        "generatorURL": external_url,
        "fingerprint": fingerprint(labels),
    }
    return {
        "version": VERSION,
        "groupKey": f'{{}}:{{diagnosis="{diagnosis.id}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": {"diagnosis": diagnosis.id},
        "commonLabels": dict(labels),
        "commonAnnotations": dict(annotations),
        "externalURL": external_url,
        "alerts": [alert],
    }

"""Alertmanager's v2 API, pure: the postable alert of a diagnosis, and the alert kept to resend.

c4 posts its findings to ``POST <alertmanager>/api/v2/alerts`` as a Prometheus server does: a
list of alerts, each a label set (its identity: Alertmanager deduplicates, groups, routes,
inhibits and silences on it), annotations, ``startsAt`` and ``endsAt``. A firing alert's
``endsAt`` is a horizon ahead (four resend periods, Prometheus's rule): the sender posts it
again every period until its diagnosis resolves, so that an alert nobody re-posts (c4 gone)
resolves by itself and one that an Alertmanager restart forgot comes back. A resolved alert's
``endsAt`` is its resolution time (never in the future, never before its start).

Labels (the same for the firing and the resolved alert of one diagnosis):
``alertname`` ``C4`` + the class in CamelCase (``C4NoncommHang``), ``class``, ``training_job``
(none for a fabric-wide finding), ``diagnosis`` (its id), ``severity``
(``critical`` for hangs, faults, a node or link down and escalations, else ``warning``),
``suspect`` and ``suspect_type`` (the alert's subject, when it is a suspect), and where the
suspect sits, named as the DCGM exporter (``Hostname``, ``gpu``, ``device`` nvidiaN) and
node_exporter's InfiniBand collector (``device`` mlx5_0, ``port`` 1) name it, plus ``node``
(the scheduler's node name, which ``Hostname`` repeats); an escalation adds
``escalation="blast_radius"``. A silence or an inhibit rule on ``node`` or ``Hostname`` thus
matches c4's alerts together with the exporters' alerts of the same machine.

The training job is ``training_job``, as on the alerts Prometheus fires from c4's findings
(``deploy/prometheus/c4-rules.yml``), where ``job`` is the scrape job's (``c4-streams``): one
route, silence or inhibit rule matches a job's alerts from either path. Alerts fired before
the rename (they said ``job``) keep their label set until they resolve: a resend and a
resolution post the labels the alert was kept with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orjson
from pydantic import JsonValue

from actions.drivers.alertmanager.payload import rfc3339
from actions.pipeline.outcome import StepSummary
from schemas.messages import Diagnosis
from schemas.places import suspect_place

API_PATH = "/api/v2/alerts"
HORIZON_PERIODS = 4  # a firing alert's endsAt: now + 4 resend periods (Prometheus)
CRITICAL = frozenset({"comm_hang", "noncomm_hang", "gpu_fault", "node_down", "link_down"})


def alertname(diagnosis_class: str) -> str:
    """``C4`` + the class in CamelCase: ``noncomm_hang`` -> ``C4NoncommHang``."""
    return "C4" + "".join(part[:1].upper() + part[1:] for part in diagnosis_class.split("_"))


def alerts_url(base: str) -> str:
    """Where an Alertmanager takes alerts, from its base URL (a route prefix kept)."""
    return base.rstrip("/") + API_PATH


def place_labels(suspect_type: str, ident: str) -> dict[str, str]:
    """Where a suspect sits: ``node``/``Hostname``, a GPU's ``gpu`` and ``device``, a NIC port's
    ``device`` and ``port`` (``node-003/mlx5_0:1`` -> mlx5_0, 1); none for fabric parts."""
    place = suspect_place(suspect_type, ident)
    found: dict[str, str] = {}
    if place.node is not None:
        found["node"] = found["Hostname"] = place.node
    if place.gpu is not None:
        found["gpu"], found["device"] = place.gpu, f"nvidia{place.gpu}"
    if place.device is not None:
        found["device"] = place.device
    if place.port is not None:
        found["port"] = place.port
    return found


def _suspect_type(diagnosis: Diagnosis, subject: str, escalation: bool) -> str | None:
    if escalation:  # the shared switch, or the job itself when no switch was found
        return "switch" if subject not in {diagnosis.job, "fabric"} else None
    return next((s.type for s in diagnosis.suspects if s.id == subject), None)


def labels_for(diagnosis: Diagnosis, subject: str, escalation: bool = False) -> dict[str, str]:
    """The alert's label set (see the module docstring)."""
    severity = "critical" if escalation or diagnosis.class_ in CRITICAL else "warning"
    found = {"alertname": alertname(diagnosis.class_), "class": diagnosis.class_}
    if diagnosis.job is not None:
        found["training_job"] = diagnosis.job
    found["diagnosis"] = diagnosis.id
    found["severity"] = severity
    suspect_type = _suspect_type(diagnosis, subject, escalation)
    if suspect_type is not None:
        found["suspect"] = subject
        found["suspect_type"] = suspect_type
        found.update(place_labels(suspect_type, subject))
    if escalation:
        found["escalation"] = "blast_radius"
    return found


def _text(value: JsonValue) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def annotations_for(
    diagnosis: Diagnosis,
    subject: str,
    earlier: Sequence[StepSummary] = (),
    escalation_nodes: Sequence[str] = (),
) -> dict[str, str]:
    """summary, description (the evidence), score, suspects, evidence (JSON), actions, nodes."""
    where = diagnosis.job or "fabric"
    top = diagnosis.suspects[0] if diagnosis.suspects else None
    suspects = ", ".join(f"{s.id} ({s.score:.2f})" for s in diagnosis.suspects) or "none"
    summary = f"{diagnosis.class_} in {where}: suspect {subject}"
    if escalation_nodes:
        summary = (
            f"{len(escalation_nodes)} nodes of {where} suspected at once:"
            f" shared component {subject} escalated, nothing isolated"
        )
    evidence = ", ".join(f"{k}={_text(v)}" for k, v in sorted(diagnosis.evidence.items()))
    lines = [
        f"c4 diagnosis {diagnosis.id}: {diagnosis.class_} in {where},"
        f" since {rfc3339(diagnosis.onset_ns)} (concluded {rfc3339(diagnosis.ts_ns)}).",
        f"Suspects: {suspects}.",
        f"Evidence: {evidence or 'none'}.",
    ]
    if earlier:
        lines.append("Actions: " + "; ".join(step.line() for step in earlier) + ".")
    found = {
        "summary": summary,
        "description": "\n".join(lines),
        "suspects": suspects,
        "evidence": orjson.dumps(diagnosis.evidence, option=orjson.OPT_SORT_KEYS).decode(),
    }
    if top is not None:
        found["score"] = f"{top.score:.2f}"
    if earlier:
        found["actions"] = "; ".join(step.line() for step in earlier)
    if escalation_nodes:
        found["nodes"] = ", ".join(escalation_nodes)
    return found


@dataclass(frozen=True, slots=True)
class Kept:
    """One diagnosis's alert as a receiver keeps it until it resolved: what is posted again.

    ``resolved_ns`` is its ``endsAt`` once resolved (None while firing); ``since_ns`` the
    wall-clock time it was last kept (how long an undelivered resolution is kept);
    ``partition`` the partition of the diagnosis topic its finding came on: the worker of the
    group that owns that partition resends it, so each alert has one sender (0 for an alert
    kept before the partition was, or kept outside a consumer group).
    """

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_ns: int
    generator_url: str = ""
    resolved_ns: int | None = None
    since_ns: int = 0
    partition: int = 0

    def alert(self, now_ns: int, horizon_ns: int) -> dict[str, JsonValue]:
        """The postable alert: a firing one ends ``horizon_ns`` from now."""
        ends = self.resolved_ns if self.resolved_ns is not None else now_ns + horizon_ns
        alert: dict[str, JsonValue] = {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": rfc3339(min(self.starts_ns, ends)),
            "endsAt": rfc3339(ends),
        }
        if self.generator_url:
            alert["generatorURL"] = self.generator_url
        return alert

    def to_json(self) -> str:
        """The form the cluster state keeps."""
        return orjson.dumps(
            {
                "labels": dict(self.labels),
                "annotations": dict(self.annotations),
                "starts_ns": self.starts_ns,
                "generator_url": self.generator_url,
                "resolved_ns": self.resolved_ns,
                "since_ns": self.since_ns,
                "partition": self.partition,
            }
        ).decode()

    @classmethod
    def from_json(cls, text: str) -> Kept | None:
        """A kept alert read back; None when it is not one (written by someone else)."""
        try:
            data = orjson.loads(text)
            labels = {str(k): str(v) for k, v in data["labels"].items()}
            notes = {str(k): str(v) for k, v in data["annotations"].items()}
            resolved = data.get("resolved_ns")
            return cls(
                labels,
                notes,
                int(data["starts_ns"]),
                str(data.get("generator_url", "")),
                None if resolved is None else int(resolved),
                int(data.get("since_ns", 0)),
                int(data.get("partition", 0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None


def kept_for(
    diagnosis: Diagnosis,
    subject: str,
    now_ns: int,
    earlier: Sequence[StepSummary] = (),
    escalation_nodes: Sequence[str] = (),
    external_url: str = "",
    fired: Kept | None = None,
    partition: int = 0,
) -> Kept:
    """The alert of one alert step (its finding read from ``partition`` of the diagnosis
    topic). A resolution keeps the label set and the start of the alert that fired
    (``fired``, when kept), so that it ends that alert and no other."""
    notes = annotations_for(diagnosis, subject, earlier, escalation_nodes)
    if diagnosis.state == "firing":
        found = labels_for(diagnosis, subject, bool(escalation_nodes))
        starts = min(diagnosis.onset_ns, now_ns)
        return Kept(found, notes, starts, external_url, None, now_ns, partition)
    found = dict(fired.labels) if fired else labels_for(diagnosis, subject)
    starts = fired.starts_ns if fired else min(diagnosis.onset_ns, now_ns)
    ends = max(starts, min(diagnosis.ts_ns, now_ns))
    merged = {**fired.annotations, **notes} if fired else notes
    return Kept(found, merged, starts, external_url, ends, now_ns, partition)

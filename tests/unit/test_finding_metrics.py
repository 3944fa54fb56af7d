"""The workers' Prometheus metrics: c4_finding_open / c4_finding_score from the detectors' open
findings, labels that join DCGM's and node_exporter's, and names by Prometheus's conventions."""

from __future__ import annotations

import re

import orjson
import pytest
from prometheus_client import generate_latest

from actions.metrics import ActionMetrics
from schemas.messages import Diagnosis, Gpu, Link, LinkCounters
from streams.core.engine import Engine
from streams.metrics import FINDING_LABELS, StreamMetrics, suspect_labels
from tests.unit.ring_job import T0, RingJob, S

PORT = "mlx5_0:1"


def link(second: int, symbol_err: int, node: str = "node-003") -> Link:
    return Link(
        v=1,
        kind="link",
        node=node,
        port=PORT,
        ts_ns=T0 + second * S,
        state="up",
        gbps=200,
        counters=LinkCounters(link_down=0, symbol_err=symbol_err),
    )


def labels_of(diagnosis: Diagnosis, index: int = 0) -> dict[str, str]:
    suspect = diagnosis.suspects[index]
    return {
        "diagnosis": diagnosis.id,
        "class": diagnosis.class_,
        "training_job": diagnosis.job or "",
        "suspect": suspect.id,
        "suspect_type": suspect.type,
        **suspect_labels(suspect.type, suspect.id),
    }


@pytest.mark.parametrize(
    ("kind", "suspect", "expected"),
    [
        ("gpu", "node-001/gpu3", {"node": "node-001", "Hostname": "node-001", "gpu": "3"}),
        (
            "port",
            "node-001/mlx5_0:1",
            {"node": "node-001", "Hostname": "node-001", "device": "mlx5_0", "port": "1"},
        ),
        ("node", "node-007", {"node": "node-007", "Hostname": "node-007"}),
        ("link", "leaf-0a--spine-0", {}),
        ("switch", "spine-0", {}),
        ("rank", "job-42/rank3", {}),
    ],
)
def test_suspect_ids_give_dcgm_and_node_exporter_labels(
    kind: str, suspect: str, expected: dict[str, str]
) -> None:
    empty = {"node": "", "Hostname": "", "gpu": "", "device": "", "port": ""}
    assert suspect_labels(kind, suspect) == empty | expected


def test_a_finding_is_exported_while_it_fires_and_gone_once_resolved() -> None:
    engine, metrics = Engine(), StreamMetrics()
    found: list[Diagnosis] = []
    errors = 0
    for second in range(8):
        errors += 50 if second >= 5 else 0
        found += engine.process(link(second, errors))
    metrics.set_open_findings(engine.open_findings())
    firing = next(d for d in found if d.state == "firing")
    labels = labels_of(firing)
    assert labels["device"] == "mlx5_0" and labels["port"] == "1"
    assert labels["Hostname"] == "node-003" and labels["training_job"] == ""
    registry = metrics.registry
    assert registry.get_sample_value("c4_finding_open", labels) == 1
    assert registry.get_sample_value("c4_finding_score", labels) == firing.suspects[0].score
    text = generate_latest(registry).decode()
    assert re.search(rf'^c4_finding_open{{[^}}]*diagnosis="{firing.id}"[^}}]*}} 1\.0$', text, re.M)
    for second in range(8, 20):
        found += engine.process(link(second, errors))
    assert [d.state for d in found] == ["firing", "resolved"]
    metrics.set_open_findings(engine.open_findings())
    # Removed, not set to 0: the alert ends at the next evaluation, sum() counts open ones.
    assert registry.get_sample_value("c4_finding_open", labels) is None
    assert "c4_finding_open{" not in generate_latest(registry).decode()


def test_one_open_series_per_finding_one_score_series_per_suspect() -> None:
    engine, metrics = Engine(), StreamMetrics()
    job = RingJob(stuck_rank={11: 40})
    found = list(engine.process(job.job_message()))
    for message in job.messages():
        found += engine.process(message)
    found += engine.process(
        Gpu(v=1, kind="gpu", node="node-009", gpu=4, ts_ns=engine.now_ns, xid=(79,))
    )
    metrics.set_open_findings(engine.open_findings())
    firing = [d for d in found if d.state == "firing"]
    assert {d.class_ for d in firing} >= {"noncomm_hang", "gpu_fault"}
    families = {family.name: family for family in metrics.registry.collect()}
    opened = families["c4_finding_open"].samples
    assert sorted(s.labels["diagnosis"] for s in opened) == sorted(d.id for d in firing)
    assert len(families["c4_finding_score"].samples) == sum(len(d.suspects) for d in firing)
    gpu = next(d for d in firing if d.class_ == "gpu_fault")
    assert metrics.registry.get_sample_value("c4_finding_open", labels_of(gpu)) == 1
    assert labels_of(gpu)["gpu"] == "4" and labels_of(gpu)["Hostname"] == "node-009"
    for sample in opened:
        assert tuple(sample.labels) == FINDING_LABELS


def test_a_handed_over_job_or_node_is_exported_by_its_new_owner_only() -> None:
    # Scaled out, a job's (or node's) state lives with the worker owning its partition: the
    # old owner drops it on revocation, the new one restores it from the snapshot. Each
    # open finding is then in exactly one worker's export, and sum() over workers is right.
    first, second = Engine(), Engine()
    job = RingJob(stuck_rank={11: 40})
    for message in [job.job_message(), *job.messages()]:
        first.process(message)
    errors = 0
    for step in range(8):
        errors += 50 if step >= 5 else 0
        first.process(link(step, errors, node="node-020"))
    before = {f.id for f in first.open_findings()}
    assert len(before) == 2
    job_state = first.job_state(job.job)
    node_state = first.node_states({"node-020"})["node-020"]
    assert job_state is not None
    first.drop_job(job.job)
    first.drop_node("node-020")
    assert first.open_findings() == []
    second.restore_job(job.job, job_state)
    second.restore_node(node_state)
    assert {f.id for f in second.open_findings()} == before


def test_detection_latency_is_observed_per_class() -> None:
    metrics = StreamMetrics()
    engine = Engine()
    found: list[Diagnosis] = []
    errors = 0
    for second in range(8):
        errors += 50 if second >= 5 else 0
        found += engine.process(link(second, errors))
    metrics.record_diagnoses(found)
    labels = {"class": "link_degraded"}
    registry = metrics.registry
    assert registry.get_sample_value("c4_stream_detection_latency_seconds_count", labels) == 1
    latency = (found[0].ts_ns - found[0].onset_ns) / S
    assert registry.get_sample_value("c4_stream_detection_latency_seconds_sum", labels) == latency


def test_lag_of_a_topic_no_longer_read_here_reads_zero() -> None:
    metrics = StreamMetrics()
    metrics.set_lag({"a": 5, "b": 7}, {"a", "b"})
    metrics.set_lag({"a": 2}, {"a"})  # b's partitions went to another worker
    registry = metrics.registry
    assert registry.get_sample_value("c4_stream_consumer_lag", {"topic": "a"}) == 2
    assert registry.get_sample_value("c4_stream_consumer_lag", {"topic": "b"}) == 0


# Label names the workers may use: their own, and those that join other exporters' series.
KNOWN_LABELS = set(FINDING_LABELS) | {
    "kind",
    "topic",
    "code",
    "state",
    "outcome",
    "action",
    "status",
    "reason",
    "cause",
    "source",
    "version",
    "le",
}


@pytest.mark.parametrize("registry", [StreamMetrics().registry, ActionMetrics().registry])
def test_metric_names_follow_prometheus_conventions(registry: object) -> None:
    from prometheus_client import CollectorRegistry

    assert isinstance(registry, CollectorRegistry)
    text = generate_latest(registry).decode()
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    assert kinds["c4_build_info"] == "gauge"
    assert "c4_build_info{version=" in text
    for name, kind in kinds.items():
        assert re.fullmatch(r"c4_[a-z][a-z0-9_]*", name, re.IGNORECASE), name
        if kind == "counter":  # prometheus_client adds _total (and a _created gauge)
            assert name.endswith("_total"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        if kind == "gauge" and not name.endswith("_created"):
            assert not name.endswith("_total"), name
        assert not re.search(r"_(util|ms|millis|percent|kb|mb)$", name), name
    for labels in re.findall(r"^c4_\w+\{([^}]*)\}", text, re.MULTILINE):
        for label in re.findall(r'(\w+)="', labels):
            assert label in KNOWN_LABELS, label


def test_the_fabric_correlators_findings_move_with_its_partition() -> None:
    # The correlator runs where the one-partition fabric-paths topic is read: its findings
    # are exported there only, and by the next owner (from the table) once it moves.
    from streams.core.fabric import FabricHub
    from streams.core.findings import SuspectScore
    from streams.detection_app import _FabricSide

    table: dict[bytes, bytes] = {}
    first = _FabricSide(FabricHub(None, S // 4), table, StreamMetrics())
    report = orjson.dumps({"now_ns": T0, "paths": {}})
    suspects = (SuspectScore("link", "leaf-0a--spine-0", 0.8),)
    book = first.hub.correlator.book
    assert book.fire(None, "link_down", "leaf-0a--spine-0", T0, T0, suspects, {}) is not None
    assert first.open_findings() == []  # not before it holds the partition
    first.on_report(report)  # holds it now; the correlator's state goes to the table
    assert [f.suspects for f in first.open_findings()] == [suspects]
    first.revoke()
    assert first.open_findings() == [] and book.open_findings() == []
    second = _FabricSide(FabricHub(None, S // 4), table, StreamMetrics())
    assert second.open_findings() == []  # not before it holds the partition
    second.on_report(report)
    assert [f.suspects for f in second.open_findings()] == [suspects]


def test_metrics_address_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from c4.settings import load_settings

    monkeypatch.delenv("C4_METRICS_ADDRESS", raising=False)
    assert load_settings().metrics_address == "127.0.0.1"  # loopback unless told
    monkeypatch.setenv("C4_METRICS_ADDRESS", "0.0.0.0")  # noqa: S104 - what a pod sets
    assert load_settings().metrics_address == "0.0.0.0"  # noqa: S104
    monkeypatch.setenv("C4_METRICS_ADDRESS", "1.2.3.4; rm")
    with pytest.raises(ValidationError):
        load_settings()

"""The Kubernetes driver's pure parts: marks, replacement pods, conflicts, configuration."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from actions.config import ConfigError, Scheduler, parse_config
from actions.drivers.kubernetes.client import (
    GENERATION,
    ISOLATED,
    ORIGIN,
    RESTARTED_FOR,
    Answer,
    ApiStatus,
    Kube,
    condition_reason,
    isolated_parts,
    label_value_ok,
    replacement_pod,
)
from producers.launch_env import resolve_identity
from schemas.messages import Member


class OneNode:
    """An API holding one node, that answers the first ``conflicts`` patches with 409 (a
    writer in between), as the API server does for a stale resourceVersion."""

    def __init__(self, conflicts: int = 0) -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": "node-001", "resourceVersion": "7"},
            "spec": {},
            "status": {},
        }
        self.conflicts = conflicts
        self.patches: list[tuple[str, Any, str]] = []

    def get(self, path: str) -> dict[str, Any]:
        assert path == "/api/v1/nodes/node-001", path
        return copy.deepcopy(self.node)

    def patch(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        self.patches.append((path, body, content_type))
        if path.endswith("/status"):
            return self.node
        if self.conflicts:
            self.conflicts -= 1
            self.node["metadata"]["resourceVersion"] = str(
                int(self.node["metadata"]["resourceVersion"]) + 1
            )
            message = "the object has been modified"
            raise ApiStatus(message, 409)
        assert body["metadata"]["resourceVersion"] == self.node["metadata"]["resourceVersion"]
        meta = self.node["metadata"]
        for key, value in body["metadata"].get("annotations", {}).items():
            annotations = meta.setdefault("annotations", {})
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        for key, value in body.get("spec", {}).items():
            if value is None:
                self.node["spec"].pop(key, None)
            else:
                self.node["spec"][key] = value
        return self.node

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError(path)

    def delete(self, path: str, grace_period_s: int) -> None:
        raise AssertionError(path)


SCHEDULER = Scheduler(kind="kubernetes")


def test_a_conflicting_write_is_read_again_and_retried() -> None:
    api = OneNode(conflicts=2)
    assert Kube(api, SCHEDULER).isolate("node-001", "node-001", "d1", "node_down") is Answer.DONE
    spec_patches = [p for p in api.patches if not p[0].endswith("/status")]
    assert [p[1]["metadata"]["resourceVersion"] for p in spec_patches] == ["7", "8", "9"]
    assert api.node["spec"]["unschedulable"] is True
    assert isolated_parts(api.node) == {"node-001": "d1 node_down"}


def test_a_person_cordon_is_held_and_survives_the_release() -> None:
    api = OneNode()
    api.node["spec"]["unschedulable"] = True
    kube = Kube(api, SCHEDULER)
    assert kube.isolate("node-001", "node-001/gpu2", "d1", "gpu_fault") is Answer.HELD
    assert "c4.io/cordoned" not in api.node["metadata"]["annotations"]
    assert kube.release("node-001", "node-001/gpu2") is Answer.DONE
    assert api.node["spec"] == {"unschedulable": True}


def test_a_dry_run_prints_the_requests_and_changes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = OneNode()
    kube = Kube(api, SCHEDULER, dry_run=True)
    assert kube.isolate("node-001", "node-001", "d1", "node_down") is Answer.DONE
    assert api.patches == []
    printed = capsys.readouterr().out
    assert printed.startswith("kubectl patch node node-001 --type=merge -p ")
    assert '"unschedulable":true' in printed and "condition C4Healthy=False" in printed


def test_marks_and_names() -> None:
    assert condition_reason("noncomm_hang") == "NoncommHang"
    assert isolated_parts({"metadata": {"annotations": {ISOLATED: "not json"}}}) == {}
    assert isolated_parts({"metadata": {"annotations": {ISOLATED: "[1]"}}}) == {}
    assert label_value_ok("llm-7b.run_2") and not label_value_ok("a/b")
    assert not label_value_ok("x" * 64)


def test_a_plain_pods_replacement_is_unbound_kept_off_and_counted() -> None:
    pod = {
        "metadata": {
            "name": "w1",
            "namespace": "train",
            "uid": "u-1",
            "resourceVersion": "12",
            "creationTimestamp": "2026-12-05T00:00:00Z",
            "labels": {"c4.io/job": "llm"},
        },
        "spec": {
            "nodeName": "node-001",
            "containers": [{"name": "train"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                        ]
                    }
                }
            },
        },
        "status": {"phase": "Pending"},
    }
    first = replacement_pod(pod, "d1", ["node-001"])
    assert first["metadata"]["name"] == "w1-c4r1"
    assert "uid" not in first["metadata"] and "resourceVersion" not in first["metadata"]
    assert "nodeName" not in first["spec"] and "status" not in first
    (term,) = first["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # The pod's own requirement kept, the failed node excluded beside it.
    assert term["matchExpressions"] == [{"key": "gpu", "operator": "Exists"}]
    assert term["matchFields"] == [
        {"key": "metadata.name", "operator": "NotIn", "values": ["node-001"]}
    ]
    # Recreated again: named after the first pod, the count going up, not the name growing.
    first["spec"]["nodeName"] = "node-002"
    second = replacement_pod(first, "d2", ["node-002"])
    assert second["metadata"]["name"] == "w1-c4r2"
    annotations = second["metadata"]["annotations"]
    assert (annotations[ORIGIN], annotations[GENERATION], annotations[RESTARTED_FOR]) == (
        "w1",
        "2",
        "d2",
    )


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("job_label", "c4.io/job name", "not a Kubernetes qualified name"),
        ("taint_key", "/fault", "not a Kubernetes qualified name"),
        ("taint_effect", "PreferNoSchedule", "taint_effect"),
        ("no_execute_classes", ["not_a_class"], "no_execute_classes"),
        ("grace_period_s", -1, "grace_period_s"),
    ],
)
def test_a_bad_kubernetes_setting_is_one_line_at_start_up(
    field: str, value: Any, said: str
) -> None:
    with pytest.raises(ConfigError, match=said) as raised:
        parse_config({"scheduler": {"kind": "kubernetes", field: value}}, {})
    assert "\n" not in str(raised.value)


def test_no_execute_for_the_classes_that_say_so() -> None:
    scheduler = Scheduler(kind="kubernetes", no_execute_classes=("node_down",))
    assert scheduler.effect_for("node_down") == "NoExecute"
    assert scheduler.effect_for("gpu_fault") == "NoSchedule"


def test_a_rank_in_a_pod_reports_its_node_and_pod_from_the_downward_api() -> None:
    env = {
        "C4_JOB": "llm",
        "RANK": "3",
        "WORLD_SIZE": "8",
        "NODE_NAME": "gpu-node-7",
        "POD_NAME": "llm-worker-3",
        "POD_NAMESPACE": "train",
    }
    identity = resolve_identity(env, "llm-worker-3")
    assert (identity.node, identity.host, identity.pod) == (
        "gpu-node-7",
        "llm-worker-3",
        "train/llm-worker-3",
    )
    outside = resolve_identity({"C4_JOB": "llm", "SLURMD_NODENAME": "n1"}, "n1")
    assert outside.pod is None and outside.node == "n1"
    member = Member(
        v=1,
        kind="member",
        job="llm",
        ts_ns=1,
        rank=3,
        world_size=8,
        node="gpu-node-7",
        pod="train/llm-worker-3",
    )
    assert member.place().pod == "train/llm-worker-3"

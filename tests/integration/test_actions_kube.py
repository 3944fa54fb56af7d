"""The action worker drives a real Kubernetes API server: cordon, taint, condition, pods.

The API server (etcd and kube-apiserver, no kubelet: pods stay Pending) holds nodes named as
the cluster state's topology names them and a training job's pods bound to them. The worker
runs as the static user ``c4-actions`` with only the ClusterRole of
``deploy/kubernetes/rbac.yaml``, so every test also proves that role is enough.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from actions.config import Scheduler
from actions.drivers.kubernetes.client import CORDONED, ISOLATED, Kube
from actions.drivers.kubernetes.official_api import ClientApi
from actions.worker import CRASH_ENV
from c4.settings import Settings
from c4.stack.kube import kubeconfig_path
from tests.integration.actions_harness import (
    REPO,
    Cluster,
    WorkerProcess,
    diagnosis,
    state_release,
    wait_for,
)

pytestmark = pytest.mark.integration

NODES = ("node-000", "node-001", "node-002", "node-003")
ROLE = REPO / "deploy" / "kubernetes" / "rbac.yaml"
BINDING = "c4-actions-test-user"


class Admin:
    """The test's own hands on the API server (as ``admin``)."""

    def __init__(self, settings: Settings) -> None:
        self.kubeconfig = kubeconfig_path(settings)
        self.api = ClientApi(str(self.kubeconfig), 10)

    def kubectl(self, *args: str) -> str:
        kubectl = shutil.which("kubectl")
        assert kubectl is not None, "kubectl is not on PATH"
        done = subprocess.run(
            [kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def node(self, name: str) -> dict[str, Any]:
        return self.api.get(f"/api/v1/nodes/{name}")

    def pods(self, namespace: str) -> dict[str, dict[str, Any]]:
        items = self.api.get(f"/api/v1/namespaces/{namespace}/pods").get("items") or []
        return {pod["metadata"]["name"]: pod for pod in items}

    def pod(
        self, namespace: str, name: str, node: str, job: str | None, owner: bool = False
    ) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {}}
        if job is not None:
            meta["labels"]["c4.io/job"] = job
        if owner:
            # A controller stands for JobSet or PyTorchJob: any owner marked controller.
            made = self.api.create(
                f"/api/v1/namespaces/{namespace}/configmaps",
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"own-{name}"}},
            )
            meta["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": made["metadata"]["name"],
                    "uid": made["metadata"]["uid"],
                    "controller": True,
                }
            ]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "train", "image": "trainer:1"}]},
        }
        self.api.create(f"/api/v1/namespaces/{namespace}/pods", body)


@pytest.fixture(scope="module")
def admin(kube_stack: Settings) -> Iterator[Admin]:
    """Admin access, and c4's ClusterRole bound to the static user ``c4-actions``."""
    made = Admin(kube_stack)
    role = next(doc for doc in yaml.safe_load_all(ROLE.read_text()) if doc["kind"] == "ClusterRole")
    roles = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
    bindings = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    for path in (f"{roles}/{role['metadata']['name']}", f"{bindings}/{BINDING}"):
        _delete_quietly(made.api, path)
    made.api.create(roles, role)
    made.api.create(
        bindings,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": BINDING},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "c4-actions"}
            ],
        },
    )
    try:
        yield made
    finally:
        _delete_quietly(made.api, f"{bindings}/{BINDING}")
        made.api.close()


def _delete_quietly(api: ClientApi, path: str) -> None:
    try:
        api.delete(path, 0)
    except Exception as error:  # noqa: BLE001 - absent is fine
        assert "404" in str(error), error


@pytest.fixture
def nodes(admin: Admin, unique: str) -> Iterator[str]:
    """The topology's first four nodes as Kubernetes nodes, and a namespace for the job's
    pods; all removed afterwards. Yields the namespace."""
    namespace = f"train-{unique}"
    admin.api.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    for name in NODES:
        _delete_quietly(admin.api, f"/api/v1/nodes/{name}")
        admin.api.create(
            "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        )
    try:
        yield namespace
    finally:
        for name in NODES:
            _delete_quietly(admin.api, f"/api/v1/nodes/{name}")
        _delete_quietly(admin.api, f"/api/v1/namespaces/{namespace}")


def kube_config(kube_stack: Settings, **scheduler: Any) -> dict[str, Any]:
    return {
        "retry": {"tries": 3, "backoff_s": 0.05, "max_backoff_s": 0.2},
        "claim_lease_s": 2,
        "policy": {"classes": {"noncomm_hang": ["isolate", "restart"]}},
        "scheduler": {
            "kind": "kubernetes",
            "kubeconfig": str(kubeconfig_path(kube_stack, "c4-actions")),
            "grace_period_s": 0,  # no kubelet: a pod deleted with a grace period stays
            "retry": {"tries": 3, "backoff_s": 0.1, "max_backoff_s": 0.5},
        }
        | scheduler,
    }


def place_job(cluster: Cluster, admin: Admin, namespace: str, job: str) -> None:
    """A job of 8 ranks on node-000..003; on node-001 a controller's pod, a plain pod and a
    pod without c4's label that the ranks named in the placement; another job's pod there."""
    admin.pod(namespace, "w0", "node-000", job)
    admin.pod(namespace, "w1-ctl", "node-001", job, owner=True)
    admin.pod(namespace, "w1-plain", "node-001", job)
    admin.pod(namespace, "w1-named", "node-001", None)
    admin.pod(namespace, "other", "node-001", "another-job")
    admin.pod(namespace, "w2", "node-002", job)
    ranks = [
        {"rank": 2 * i + g, "node": node, "gpu": g, "pod": f"{namespace}/w{i}"}
        for i, node in enumerate(NODES)
        for g in range(2)
    ]
    ranks[2]["pod"] = f"{namespace}/w1-named"
    cluster.send(
        "job",
        {
            "v": 1,
            "kind": "job",
            "job": job,
            "ts_ns": 1_000,
            "state": "running",
            "ranks": ranks,
            "comms": {"c0": list(range(8))},
        },
        key=job,
    )
    wait_for(lambda: cluster.state.jobs.placement(job), what=f"placement of {job} recorded")


def write_config(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def c4_marks(node: dict[str, Any]) -> tuple[bool, list[dict[str, Any]], list[dict[str, Any]]]:
    """(cordoned, c4's taints, c4's conditions) of a node."""
    spec = node.get("spec", {})
    taints = [t for t in spec.get("taints") or [] if t["key"] == "c4.io/fault"]
    conditions = [
        c for c in node.get("status", {}).get("conditions") or [] if c["type"] == "C4Healthy"
    ]
    return spec.get("unschedulable") is True, taints, conditions


def test_a_hang_cordons_taints_and_conditions_the_node_and_takes_the_jobs_pods_off_it(
    cluster: Cluster, admin: Admin, nodes: str, kube_stack: Settings, tmp_path: Path
) -> None:
    job = f"llm-{cluster.unique}"
    worker = WorkerProcess(
        cluster, write_config(tmp_path, kube_config(kube_stack)), tmp_path / "worker.log"
    )
    try:
        place_job(cluster, admin, nodes, job)  # the worker records the placement
        cluster.send(
            "diagnosis",
            diagnosis("d-k1", job, [("gpu", "node-001/gpu1", 0.95)], onset_ns=time.time_ns()),
            job,
        )
        actions = cluster.wait_actions(2, timeout_s=60)
    finally:
        worker.stop()
    by_name = {a.action: a for a in actions}
    assert by_name["isolate"].status == "done", worker.log()
    assert by_name["isolate"].detail["kubernetes"] == "done"
    restart = by_name["restart"]
    assert restart.status == "done", (restart, worker.log())
    # The controller's pod deleted; the plain ones (one found by label, one named by its
    # rank's report) recreated off the node.
    assert restart.detail["deleted"] == [f"{nodes}/w1-ctl"]
    assert restart.detail["recreated"] == {
        f"{nodes}/w1-named": f"{nodes}/w1-named-c4r1",
        f"{nodes}/w1-plain": f"{nodes}/w1-plain-c4r1",
    }
    assert restart.detail["restarts"] == 1
    # The node as an operator sees it.
    described = admin.kubectl("describe", "node", "node-001")
    assert "Unschedulable:      true" in described, described
    assert "c4.io/fault=noncomm_hang:NoSchedule" in described, described
    condition = next(line for line in described.splitlines() if "C4Healthy" in line)
    assert "False" in condition and "NoncommHang" in condition, condition
    assert "c4 isolated node-001: c4:d-k1 noncomm_hang" in condition, condition
    cordoned, taints, _ = c4_marks(admin.node("node-001"))
    assert cordoned and len(taints) == 1
    # Only that node's pods of that job went; the plain one is back, kept off the node.
    pods = admin.pods(nodes)
    assert sorted(pods) == ["other", "w0", "w1-named-c4r1", "w1-plain-c4r1", "w2"]
    replacement = pods["w1-plain-c4r1"]
    assert replacement["spec"].get("nodeName") is None
    assert replacement["metadata"]["labels"]["c4.io/job"] == job
    terms = replacement["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-001"]}]}
    ]
    for healthy in ("node-000", "node-002"):
        assert c4_marks(admin.node(healthy)) == (False, [], [])


def test_a_finding_of_the_run_before_the_restart_marks_nothing_after_a_release(
    cluster: Cluster, admin: Admin, nodes: str, kube_stack: Settings, tmp_path: Path
) -> None:
    # One fault, two findings: the second from the last reports of the run the first one's
    # restart replaced (same stopped ranks, an onset before the restart). The node was
    # given back in between; the second finding must not take it out again.
    job = f"llm-{cluster.unique}"
    config_path = write_config(tmp_path, kube_config(kube_stack))
    worker = WorkerProcess(cluster, config_path, tmp_path / "worker.log")
    try:
        place_job(cluster, admin, nodes, job)
        onset = time.time_ns()  # while the job runs: its pods are older
        suspects = [("gpu", "node-001/gpu1", 0.95)]
        cluster.send("diagnosis", diagnosis("d-k3", job, suspects, onset_ns=onset), job)
        cluster.wait_actions(2, timeout_s=60)
        released = state_release(cluster, config_path, "node-001")
        assert released.returncode == 0, released.stderr
        # Creation times are whole seconds: an onset well before the replacements.
        late = diagnosis("d-k3b", job, suspects, onset_ns=onset - 2_000_000_000)
        cluster.send("diagnosis", late, job)
        actions = cluster.wait_actions(4, timeout_s=60)
    finally:
        worker.stop()
    second = {a.action: a for a in actions if a.diagnosis == "d-k3b"}
    assert {name: (a.status, a.detail.get("reason")) for name, a in second.items()} == {
        "isolate": ("skipped", "earlier_run"),
        "restart": ("skipped", "earlier_run"),
    }, worker.log()
    assert c4_marks(admin.node("node-001")) == (False, [], [])  # still in service
    assert cluster.state.components.component("node", "node-001").state == "healthy"


@pytest.mark.parametrize("crash_at", ["kube_marked", "kube_deleted"])
def test_killed_mid_action_still_one_set_of_marks_and_one_deletion(
    cluster: Cluster,
    admin: Admin,
    nodes: str,
    kube_stack: Settings,
    tmp_path: Path,
    crash_at: str,
) -> None:
    job = f"llm-{cluster.unique}"
    config_path = write_config(tmp_path, kube_config(kube_stack))
    log = tmp_path / "worker.log"
    doomed = WorkerProcess(cluster, config_path, log, **{CRASH_ENV: crash_at})
    try:
        place_job(cluster, admin, nodes, job)
        cluster.send(
            "diagnosis",
            diagnosis("d-k2", job, [("node", "node-001", 0.9)], onset_ns=time.time_ns()),
            job,
        )
        assert doomed.process.wait(60) == -signal.SIGKILL, doomed.log()
    finally:
        doomed.stop()
    left = sorted(admin.pods(nodes))
    if crash_at == "kube_marked":  # marked, no pod touched yet
        assert left == ["other", "w0", "w1-ctl", "w1-named", "w1-plain", "w2"]
    else:  # killed after the first deletion (w1-ctl, the first in name order)
        assert "w1-ctl" not in left and "w1-named" in left
    survivor = WorkerProcess(cluster, config_path, log)
    try:
        actions = cluster.wait_actions(2, timeout_s=60)
    finally:
        survivor.stop()
    by_name = {a.action: a for a in actions}
    assert by_name["isolate"].status == "done", survivor.log()
    assert by_name["restart"].status == "done", (by_name["restart"], survivor.log())
    # One set of marks: one taint of c4's, one condition, the node cordoned once by c4.
    node = admin.node("node-001")
    cordoned, taints, conditions = c4_marks(node)
    assert cordoned and len(taints) == 1 and len(conditions) == 1
    assert node["metadata"]["annotations"][CORDONED] == "true"
    # One deletion: each pod of the job on the node gone, the plain one recreated once.
    assert sorted(admin.pods(nodes)) == ["other", "w0", "w1-named-c4r1", "w1-plain-c4r1", "w2"]
    assert cluster.state.jobs.counted_for(job, "d-k2")
    assert cluster.state.jobs.info(job)["restarts"] == "1"


def test_release_removes_only_c4s_marks_and_a_persons_cordon_survives(
    cluster: Cluster, admin: Admin, nodes: str, kube_stack: Settings, tmp_path: Path
) -> None:
    config_path = write_config(tmp_path, kube_config(kube_stack))
    # A person cordons node-003 for a disk check before c4 finds anything there.
    admin.kubectl("cordon", "node-003")
    worker = WorkerProcess(cluster, config_path, tmp_path / "worker.log")
    try:
        cluster.send("diagnosis", diagnosis("d-r1", None, [("node", "node-002", 0.9)]))
        cluster.send("diagnosis", diagnosis("d-r2", None, [("node", "node-003", 0.9)]))
        isolations = wait_for(
            lambda: (
                len(found := [a for a in cluster.actions() if a.action == "isolate"]) == 2 and found
            ),
            60,
            "two isolate records",
        )
    finally:
        worker.stop()
    answers = {a.target: a.detail.get("kubernetes") for a in isolations}
    assert answers == {"node-002": "done", "node-003": "held"}, worker.log()
    for name in ("node-002", "node-003"):
        cordoned, taints, conditions = c4_marks(admin.node(name))
        assert cordoned and len(taints) == 1 and len(conditions) == 1
    mine = state_release(cluster, config_path, "node-002")
    assert mine.returncode == 0, mine.stderr
    assert "kubernetes: c4's taint and condition removed from node-002" in mine.stdout
    theirs = state_release(cluster, config_path, "node-003")
    assert theirs.returncode == 0, theirs.stderr
    assert c4_marks(admin.node("node-002")) == (False, [], [])
    # c4's taint and condition gone from node-003, the person's cordon still there.
    assert c4_marks(admin.node("node-003")) == (True, [], [])
    for name in ("node-002", "node-003"):
        annotations = admin.node(name)["metadata"].get("annotations") or {}
        assert ISOLATED not in annotations and CORDONED not in annotations
    again = state_release(cluster, config_path, "node-002")
    assert again.returncode == 1 and "node-002 is healthy" in again.stderr, again.stderr
    assert c4_marks(admin.node("node-002")) == (False, [], [])


def test_a_gpu_and_a_port_of_one_node_share_its_marks_until_both_are_released(
    admin: Admin, nodes: str, kube_stack: Settings
) -> None:
    del nodes
    scheduler = Scheduler(
        kind="kubernetes",
        kubeconfig=str(kubeconfig_path(kube_stack, "c4-actions")),
        no_execute_classes=("link_down",),
    )
    api = ClientApi(scheduler.kubeconfig, 10)
    try:
        kube = Kube(api, scheduler)
        assert kube.isolate("node-000", "node-000/gpu3", "d-g", "xid_error").value == "done"
        assert kube.isolate("node-000", "node-000/mlx5_0:1", "d-p", "link_down").value == "done"
        assert kube.isolate("node-000", "node-000/gpu3", "d-g", "xid_error").value == "already"
        _, taints, conditions = c4_marks(admin.node("node-000"))
        # The latest part's class decides the taint; NoExecute for the classes that say so.
        assert taints == [{"key": "c4.io/fault", "value": "link_down", "effect": "NoExecute"}]
        assert "node-000/gpu3: c4:d-g xid_error" in conditions[0]["message"]
        assert "node-000/mlx5_0:1: c4:d-p link_down" in conditions[0]["message"]
        assert kube.release("node-000", "node-000/gpu3").value == "kept"
        cordoned, taints, conditions = c4_marks(admin.node("node-000"))
        assert cordoned and taints and "gpu3" not in conditions[0]["message"]
        assert kube.release("node-000", "node-000/mlx5_0:1").value == "done"
        assert c4_marks(admin.node("node-000")) == (False, [], [])
    finally:
        api.close()

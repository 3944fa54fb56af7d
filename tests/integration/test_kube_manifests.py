"""The Kubernetes manifests (deploy/kubernetes/) against a real kube-apiserver.

Every object of every manifest file is accepted by a server-side dry run (the API server's
validation and admission, unknown fields rejected); the actions worker's ClusterRole grants
exactly the verbs the Kubernetes driver uses, and bound to the API server's user
``c4-actions`` it lets that user cordon, taint and mark a node and find, delete and create
pods, and nothing else (no node deleted, no secret read).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from actions.config import parse_config
from c4.cli import build_parser
from c4.settings import Settings
from c4.stack.kube import kubeconfig_path

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
NAMESPACE = "c4"
FIELD_MANAGER = "c4-manifest-test"
ACTIONS_USER = "c4-actions"  # the stack's static user with no rights of its own
# (API group, resource) -> the verbs the Kubernetes driver uses; the ClusterRole's all.
DRIVER_VERBS = {
    ("", "nodes"): {"get", "patch"},
    ("", "nodes/status"): {"patch"},
    ("", "pods"): {"get", "list", "create", "delete"},
}
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# Resources the role must not reach with any verb, beside the verbs it lacks on its own.
OTHER_RESOURCES = (
    ("", "secrets", ""),
    ("", "configmaps", ""),
    ("", "pods", "eviction"),
    ("", "pods", "exec"),
    ("", "pods", "status"),
    ("", "serviceaccounts", "token"),
    ("apps", "deployments", ""),
    ("rbac.authorization.k8s.io", "clusterrolebindings", ""),
)
RBAC_WAIT_S = 30.0


def manifest_files() -> list[Path]:
    files = sorted(MANIFESTS.glob("*.yaml"))
    assert files, f"no manifests in {MANIFESTS}"
    return files


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def only(path: Path, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for doc in documents(path)
        if doc["kind"] == kind and name in (None, doc["metadata"]["name"])
    ]
    assert len(found) == 1, f"{path.name}: {len(found)} objects of kind {kind} {name or ''}"
    return found[0]


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    listed: list[dict[str, Any]] = spec.get("initContainers", []) + spec["containers"]
    return listed


@pytest.fixture
def admin(kube_stack: Settings) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig_path(kube_stack)))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def actions_user(kube_stack: Settings) -> Iterator[client.ApiClient]:
    path = kubeconfig_path(kube_stack, ACTIONS_USER)
    api = config.new_client_from_config(config_file=str(path))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(admin: client.ApiClient) -> str:
    """The namespace of namespace.yaml, created for real (kept: others may share the server)."""
    body = only(MANIFESTS / "namespace.yaml", "Namespace")
    assert body["metadata"]["name"] == NAMESPACE
    try:
        client.CoreV1Api(admin).create_namespace(body)
    except ApiException as error:
        if error.status != 409:  # AlreadyExists: an earlier test made it
            raise
    return NAMESPACE


def test_every_object_has_c4_labels_and_commands_parse() -> None:
    for path in manifest_files():
        for doc in documents(path):
            where = f"{path.name}: {doc['kind']} {doc['metadata']['name']}"
            labels = doc["metadata"].get("labels", {})
            assert labels.get("app.kubernetes.io/name") == "c4", where
            assert labels.get("app.kubernetes.io/part-of") == "c4", where
            if doc["kind"] in {"Deployment", "DaemonSet", "Job"}:
                template = doc["spec"]["template"]["metadata"]["labels"]
                assert template.get("app.kubernetes.io/name") == "c4", where
                for container in containers(doc):
                    command = container.get("command", [])
                    if command[:1] == ["c4"]:
                        # argparse exits (SystemExit) on an unknown subcommand or option.
                        args = build_parser().parse_args(command[1:])
                        assert callable(args.handler), where
                        assert container["image"] == "c4:0.1.0", where


def test_actions_config_is_valid_and_drives_kubernetes() -> None:
    settings = only(MANIFESTS / "config.yaml", "ConfigMap", "c4-settings")["data"]
    assert all(key.startswith("C4_") for key in settings)
    # The settings object takes the ConfigMap as the environment it becomes.
    fields = {key.removeprefix("C4_").lower(): value for key, value in settings.items()}
    assert Settings(**fields).kafka_bootstrap == settings["C4_KAFKA_BOOTSTRAP"]
    actions = only(MANIFESTS / "config.yaml", "ConfigMap", "c4-actions-config")
    worker = parse_config(yaml.safe_load(actions["data"]["actions.yaml"]), env={})
    assert worker.scheduler.kind == "kubernetes"
    assert worker.scheduler.kubeconfig is None  # the pod's service account
    deployment = only(MANIFESTS / "actions-worker.yaml", "Deployment")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    mounts = deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    config_dir = next(m["mountPath"] for m in mounts if m["name"] == "config")
    assert command[command.index("--config") + 1] == f"{config_dir}/actions.yaml"


def test_server_accepts_every_manifest(admin: client.ApiClient, namespace: str) -> None:
    dynamic = DynamicClient(admin)
    accepted = []
    for path in manifest_files():
        for doc in documents(path):
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            # The example training job names no namespace (it goes in the training's own).
            target = doc["metadata"].get("namespace", namespace) if resource.namespaced else None
            answer = resource.server_side_apply(
                body=doc,
                namespace=target,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                dry_run="All",
                query_params=[("fieldValidation", "Strict")],
            )
            assert answer.kind == doc["kind"]
            assert answer.metadata.name == doc["metadata"]["name"]
            accepted.append(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}")
    kinds = {entry.split(":")[1].split("/")[0] for entry in accepted}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "DaemonSet",
        "Job",
    } <= kinds


def granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no names, no URLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.setdefault((group, resource), set()).update(rule["verbs"])
    return found


def test_role_grants_only_the_driver_verbs() -> None:
    rbac = MANIFESTS / "rbac.yaml"
    role = only(rbac, "ClusterRole")
    assert granted(role) == DRIVER_VERBS
    binding = only(rbac, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = only(rbac, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"]}
    assert binding["subjects"] == [subject | {"namespace": account["metadata"]["namespace"]}]
    deployment = only(MANIFESTS / "actions-worker.yaml", "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == subject["name"]
    # No other c4 workload gets a token for the API.
    for name in ("streams-worker.yaml", "node-agent.yaml"):
        for doc in documents(MANIFESTS / name):
            assert doc["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def allowed(admin: client.ApiClient, user: str, group: str, resource: str, verb: str) -> bool:
    name, _, subresource = resource.partition("/")
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=["system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                group=group, resource=name, subresource=subresource or None, verb=verb
            ),
        )
    )
    answer = client.AuthorizationV1Api(admin).create_subject_access_review(review)
    return bool(answer.status.allowed)


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + RBAC_WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {RBAC_WAIT_S:.0f} s: {what}")
        time.sleep(0.2)


def forbidden(call: Callable[[], object]) -> bool:
    try:
        call()
    except ApiException as error:
        return error.status == 403
    return False


def undo(call: Callable[[], object]) -> None:
    """Delete what a test made; gone already (404) is fine."""
    try:
        call()
    except ApiException as error:
        if error.status != 404:
            raise


CORDON = {
    "spec": {
        "unschedulable": True,
        "taints": [{"key": "c4.io/fault", "value": "noncomm_hang", "effect": "NoSchedule"}],
    }
}
CONDITION = {
    "status": {
        "conditions": [
            {"type": "C4Healthy", "status": "False", "reason": "C4Isolated", "message": "c4"}
        ]
    }
}


def test_bound_role_allows_the_driver_and_nothing_more(
    admin: client.ApiClient, actions_user: client.ApiClient, namespace: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    role = only(MANIFESTS / "rbac.yaml", "ClusterRole")
    role_name = f"c4-actions-test-{suffix}"
    # A user of this test's own, for the authorizer's answers: no other test binds it.
    probe_user = f"c4-manifest-test-{suffix}"
    node_name, pod_name, job = f"c4-test-node-{suffix}", f"c4-test-pod-{suffix}", f"job-{suffix}"
    selector = f"c4.io/job={job}"
    rbac_api, core = client.RbacAuthorizationV1Api(admin), client.CoreV1Api(admin)
    user = client.CoreV1Api(actions_user)
    labels = role["metadata"]["labels"]
    with ExitStack() as made:
        rbac_api.create_cluster_role(
            {"metadata": {"name": role_name, "labels": labels}, "rules": role["rules"]}
        )
        made.callback(undo, lambda: rbac_api.delete_cluster_role(role_name))
        core.create_node({"metadata": {"name": node_name}})
        made.callback(undo, lambda: core.delete_node(node_name))
        rank = {"name": "rank", "image": "registry.example/trainer:1"}
        pod = {
            "metadata": {"name": pod_name, "labels": {"c4.io/job": job}},
            "spec": {"nodeName": node_name, "containers": [rank]},
        }
        core.create_namespaced_pod(namespace, pod)
        made.callback(
            undo, lambda: core.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)
        )
        assert not allowed(admin, probe_user, "", "nodes", "patch")
        assert forbidden(lambda: user.delete_node(node_name))

        subjects = [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": who}
            for who in (ACTIONS_USER, probe_user)
        ]
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name}
        rbac_api.create_cluster_role_binding(
            {
                "metadata": {"name": role_name, "labels": labels},
                "roleRef": ref,
                "subjects": subjects,
            }
        )
        made.callback(undo, lambda: rbac_api.delete_cluster_role_binding(role_name))
        wait_until(lambda: allowed(admin, probe_user, "", "nodes", "patch"), "the binding in force")

        # The authorizer's answer for every verb on the driver's resources and others.
        for (group, resource), verbs in DRIVER_VERBS.items():
            for verb in VERBS:
                answer = allowed(admin, probe_user, group, resource, verb)
                assert answer == (verb in verbs), f"{verb} {resource}: {answer}"
        for group, resource, subresource in OTHER_RESOURCES:
            name = f"{resource}/{subresource}" if subresource else resource
            for verb in VERBS:
                assert not allowed(admin, probe_user, group, name, verb), f"{verb} {name}"

        # The driver's calls, made as the user c4-actions with the role bound: isolate...
        wait_until(lambda: not forbidden(lambda: user.read_node(node_name)), "c4-actions reads")
        user.patch_node(node_name, CORDON)
        user.patch_node_status(node_name, CONDITION)
        node = user.read_node(node_name)
        assert node.spec.unschedulable is True
        assert [(t.key, t.effect) for t in node.spec.taints] == [("c4.io/fault", "NoSchedule")]
        assert [(c.type, c.status) for c in node.status.conditions] == [("C4Healthy", "False")]
        # ... and restart: the job's pods found, one recreated off the node, the old deleted.
        pods = user.list_pod_for_all_namespaces(label_selector=selector).items
        assert [(p.metadata.name, p.spec.node_name) for p in pods] == [(pod_name, node_name)]
        assert len(user.list_namespaced_pod(namespace, label_selector=selector).items) == 1
        assert user.read_namespaced_pod(pod_name, namespace).metadata.name == pod_name
        again = {
            "metadata": {"name": f"{pod_name}-again", "labels": {"c4.io/job": job}},
            "spec": {"containers": [rank]},
        }
        user.create_namespaced_pod(namespace, again, dry_run="All")
        user.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)
        wait_until(
            lambda: not core.list_namespaced_pod(namespace, label_selector=selector).items,
            "the pod deleted",
        )

        # And nothing beyond them.
        assert forbidden(lambda: user.delete_node(node_name))
        assert forbidden(lambda: user.replace_node(node_name, core.read_node(node_name)))
        assert forbidden(lambda: user.list_secret_for_all_namespaces())
        assert forbidden(lambda: user.list_namespaced_secret(namespace))
        assert forbidden(lambda: user.patch_namespaced_pod(pod_name, namespace, {}))
        eviction = {"metadata": {"name": pod_name, "namespace": namespace}}
        assert forbidden(lambda: user.create_namespaced_pod_eviction(pod_name, namespace, eviction))
        assert core.read_node(node_name).metadata.name == node_name

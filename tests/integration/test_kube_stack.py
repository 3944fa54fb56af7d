"""The stack's Kubernetes API server (`c4.stack.kube`): a real etcd and kube-apiserver.

The server is the session's (the ``kube_stack`` fixture): it answers /readyz, lets ``admin``
create and delete a Node, refuses ``c4-actions`` what no binding grants it, and a second
stack on its ports is refused before anything starts.
"""

from __future__ import annotations

import json
import socket
import ssl
import urllib.request
import uuid
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from c4.cli import main
from c4.settings import Settings
from c4.stack import StackError, kube_status, kube_up, kubeconfig_path
from c4.stack.kube import ca_path, run_dir

pytestmark = pytest.mark.integration


def test_readyz_answers_ok_over_verified_tls(kube_stack: Settings) -> None:
    token = kubeconfig_token(kubeconfig_path(kube_stack))
    request = urllib.request.Request(
        f"https://127.0.0.1:{kube_stack.stack_kube_port}/readyz",
        headers={"Authorization": f"Bearer {token}"},
    )
    context = ssl.create_default_context(cafile=str(ca_path(kube_stack)))
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:  # noqa: S310
        assert answer.status == 200
        assert answer.read().strip() == b"ok"


def kubeconfig_token(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("token:"):
            return line.split(":", 1)[1].strip()
    message = f"no token in {path}"
    raise AssertionError(message)


def test_admin_creates_and_deletes_a_node(kube_stack: Settings) -> None:
    name = f"node-test-{uuid.uuid4().hex[:8]}"
    with config.new_client_from_config(str(kubeconfig_path(kube_stack))) as api_client:
        core = client.CoreV1Api(api_client)
        created = core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
        assert created.metadata.name == name
        assert name in {node.metadata.name for node in core.list_node().items}
        core.delete_node(name)
        assert name not in {node.metadata.name for node in core.list_node().items}


def test_actions_user_is_forbidden_without_a_binding(kube_stack: Settings) -> None:
    path = kubeconfig_path(kube_stack, "c4-actions")
    assert path.stat().st_mode & 0o777 == 0o600
    with config.new_client_from_config(str(path)) as api_client:
        with pytest.raises(ApiException) as raised:
            client.CoreV1Api(api_client).list_node()
    assert raised.value.status == 403
    message = json.loads(raised.value.body)["message"]
    assert 'User "c4-actions" cannot list resource "nodes"' in message


def test_cli_status_lists_etcd_and_apiserver_running(
    kube_stack: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("C4_STACK_DIR", str(kube_stack.stack_dir))
    monkeypatch.setenv("C4_STACK_KUBE_PORT", str(kube_stack.stack_kube_port))
    monkeypatch.setenv("C4_STACK_ETCD_PORT", str(kube_stack.stack_etcd_port))
    # No Kafka or Redis of this stack folder: status says so with LSB's "not running" (3).
    monkeypatch.setenv("C4_STACK_KAFKA_PORT", str(free_port()))
    monkeypatch.setenv("C4_STACK_CONTROLLER_PORT", str(free_port()))
    monkeypatch.setenv("C4_STACK_REDIS_PORT", str(free_port()))
    assert main(["stack", "status", "--json"]) == 3
    statuses = {
        status["name"]: status for status in map(json.loads, capsys.readouterr().out.splitlines())
    }
    pids = {status.name: status.pid for status in kube_status(kube_stack)}
    for name, port in (
        ("etcd", kube_stack.stack_etcd_port),
        ("kube-apiserver", kube_stack.stack_kube_port),
    ):
        assert statuses[name]["state"] == "running"
        assert statuses[name]["address"] == f"127.0.0.1:{port}"
        assert statuses[name]["pid"] == pids[name] is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_another_stack_on_taken_ports_is_refused_before_starting(
    kube_stack: Settings, tmp_path: Path
) -> None:
    other = Settings(
        stack_dir=tmp_path,
        stack_kube_port=kube_stack.stack_kube_port,
        stack_etcd_port=kube_stack.stack_etcd_port,
    )
    with pytest.raises(StackError, match="C4_STACK_ETCD_PORT") as raised:
        kube_up(other)
    assert f"port {kube_stack.stack_etcd_port} on 127.0.0.1 is taken" in str(raised.value)
    # etcd's port free, the apiserver's taken: etcd is not started either.
    other = other.model_copy(update={"stack_etcd_port": free_port()})
    with pytest.raises(StackError, match="C4_STACK_KUBE_PORT"):
        kube_up(other)
    assert not any(run_dir(other).glob("*.pid"))
    assert {status.state for status in kube_status(other)} == {"stopped", "foreign"}

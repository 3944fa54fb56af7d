"""The stack's Kubernetes API server without starting it: the binary's lookup and build, the
credentials' files, the kubeconfig, the processes' command lines, the CLI flag."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from c4.cli import build_parser
from c4.settings import Settings
from c4.stack import StackError, kube, kube_down, kube_status, kube_up, kubeconfig_path
from c4.stack.kube import (
    apiserver_argv,
    build_apiserver,
    cached_apiserver,
    etcd_argv,
    find_apiserver,
    render_kubeconfig,
    render_token_csv,
    run_dir,
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(stack_dir=tmp_path / "stack", stack_kube_port=16999, stack_etcd_port=12999)


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def test_apiserver_lookup_order_env_then_shared_then_cache(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared" / "k8s" / "kube-apiserver"
    monkeypatch.setattr(kube, "SHARED_APISERVER", shared)
    monkeypatch.delenv("C4_KUBE_APISERVER", raising=False)
    assert find_apiserver(settings) is None  # nothing anywhere: up builds it
    cached = executable(cached_apiserver(settings))
    assert cached == settings.stack_dir / "k8s" / "bin" / "kube-apiserver"
    assert find_apiserver(settings) == cached
    executable(shared)
    assert find_apiserver(settings) == shared
    explicit = executable(tmp_path / "elsewhere" / "kube-apiserver")
    monkeypatch.setenv("C4_KUBE_APISERVER", str(explicit))
    assert find_apiserver(settings) == explicit
    explicit.chmod(0o644)
    with pytest.raises(StackError, match="C4_KUBE_APISERVER=.* is not an executable file"):
        find_apiserver(settings)


def test_shared_binary_is_looked_up_beside_the_repository() -> None:
    repository = Path(kube.__file__).resolve().parents[2]
    assert (repository / "pyproject.toml").is_file()
    assert kube.SHARED_APISERVER == repository.parent / "shared" / "k8s" / "kube-apiserver"
    assert (kube.GO_MODULE_DIR / "go.mod").is_file()
    assert (kube.GO_MODULE_DIR / "tools.go").is_file()


def test_build_without_go_is_one_line_error(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(StackError, match="Go is missing") as raised:
        build_apiserver(settings)
    assert "\n" not in str(raised.value)
    assert not cached_apiserver(settings).exists()


FAKE_GO = """#!{python}
import json, os, sys
with open(os.environ["FAKE_GO_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if "build" in sys.argv:
    out = sys.argv[sys.argv.index("-o") + 1]
    with open(out, "w") as binary:
        binary.write("#!/bin/sh\\n")
    os.chmod(out, 0o755)
"""


def test_build_runs_the_recipe_with_go_into_the_cache(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    executable(bin_dir / "go", FAKE_GO.format(python=sys.executable))
    log = tmp_path / "go.log"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_GO_LOG", str(log))
    monkeypatch.setattr(kube, "SHARED_APISERVER", tmp_path / "absent")
    monkeypatch.delenv("C4_KUBE_APISERVER", raising=False)
    lines: list[str] = []
    built = build_apiserver(settings, progress=lines.append)
    assert built == cached_apiserver(settings)
    assert find_apiserver(settings) == built
    module = settings.stack_dir / "k8s" / "mod"
    calls = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [call[:4] for call in calls] == [
        ["-C", str(module), "mod", "download"],
        ["-C", str(module), "mod", "tidy"],
        ["-C", str(module), "build", "-trimpath"],
    ]
    assert calls[0][4:] == ["-json", "k8s.io/kubernetes@v1.37.2"]
    ldflags = calls[2][4]
    assert ldflags.startswith("-ldflags=-s -w ")
    for flag in ("gitVersion=v1.37.2", "gitMajor=1", "gitMinor=37"):
        assert f"-X k8s.io/component-base/version.{flag}" in ldflags
    assert calls[2][-1] == "k8s.io/kubernetes/cmd/kube-apiserver"
    # The shipped module files, copied: the build never writes into the repository.
    assert (module / "go.mod").read_text() == (kube.GO_MODULE_DIR / "go.mod").read_text()
    assert (module / "stub" / "sample-controller" / "go.mod").is_file()
    assert any("go build" in line for line in lines)
    # A second build finds the cached binary and runs nothing.
    assert build_apiserver(settings) == built
    assert len(log.read_text(encoding="utf-8").splitlines()) == 3


def test_token_csv_gives_admin_system_masters_and_actions_no_group() -> None:
    text = render_token_csv({"admin": "a" * 48, "c4-actions": "b" * 48})
    assert text.splitlines() == [
        f'{"a" * 48},admin,admin,"system:masters"',
        f"{'b' * 48},c4-actions,c4-actions",
    ]


def test_rendered_kubeconfig(tmp_path: Path) -> None:
    ca = tmp_path / "certs" / "apiserver.crt"
    config = yaml.safe_load(render_kubeconfig("https://127.0.0.1:6443", ca, "c4-actions", "t0k"))
    assert config["kind"] == "Config"
    assert config["clusters"] == [
        {
            "name": "c4-local",
            "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority": str(ca)},
        }
    ]
    assert config["users"] == [{"name": "c4-actions", "user": {"token": "t0k"}}]
    assert config["contexts"] == [
        {"name": "c4-actions@c4-local", "context": {"cluster": "c4-local", "user": "c4-actions"}}
    ]
    assert config["current-context"] == "c4-actions@c4-local"


def test_kubeconfig_path_per_user_private(settings: Settings) -> None:
    with pytest.raises(StackError, match="run `c4 stack up --kube` first"):
        kubeconfig_path(settings)
    pki = run_dir(settings) / "pki"
    pki.mkdir(parents=True)
    (pki / "token.csv").write_text(render_token_csv({"admin": "A1", "c4-actions": "B2"}))
    for user, token in (("admin", "A1"), ("c4-actions", "B2")):
        path = kubeconfig_path(settings, user)
        assert path == run_dir(settings) / f"kubeconfig-{user}.yaml"
        assert path.stat().st_mode & 0o777 == 0o600
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert config["users"][0]["user"]["token"] == token
        cluster = config["clusters"][0]["cluster"]
        assert cluster["server"] == "https://127.0.0.1:16999"
        assert cluster["certificate-authority"] == str(run_dir(settings) / "certs/apiserver.crt")
    assert kubeconfig_path(settings) == run_dir(settings) / "kubeconfig-admin.yaml"
    with pytest.raises(StackError, match="no Kubernetes user 'nobody'"):
        kubeconfig_path(settings, "nobody")


def test_apiserver_argv_is_the_recipe_on_our_ports(settings: Settings) -> None:
    folder = settings.stack_dir / "run" / "kube-16999"
    argv = apiserver_argv(settings, Path("/opt/kube-apiserver"))
    assert argv == [
        "/opt/kube-apiserver",
        "--etcd-servers=http://127.0.0.1:12999",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        "--secure-port=16999",
        "--endpoint-reconciler-type=none",
        f"--cert-dir={folder}/certs",
        f"--token-auth-file={folder}/pki/token.csv",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={folder}/pki/sa.pub",
        f"--service-account-signing-key-file={folder}/pki/sa.key",
        "--service-cluster-ip-range=10.96.0.0/24",
        "--disable-admission-plugins=ServiceAccount",
    ]


def test_etcd_argv_client_and_peer_ports(settings: Settings) -> None:
    argv = etcd_argv(settings, "/usr/bin/etcd")
    assert argv[0] == "/usr/bin/etcd"
    assert f"--data-dir={run_dir(settings)}/etcd-data" in argv
    assert "--listen-client-urls=http://127.0.0.1:12999" in argv
    assert "--listen-peer-urls=http://127.0.0.1:13000" in argv
    assert "--initial-cluster=c4=http://127.0.0.1:13000" in argv


def test_never_started_is_empty_status_and_a_quiet_down(settings: Settings) -> None:
    assert kube_status(settings) == []
    assert {status.state for status in kube_down(settings)} == {"stopped"}
    assert not run_dir(settings).exists()


def test_up_refuses_an_apiserver_port_on_etcd(tmp_path: Path) -> None:
    clash = Settings(stack_dir=tmp_path, stack_kube_port=12380, stack_etcd_port=12379)
    with pytest.raises(StackError, match="C4_STACK_KUBE_PORT must differ"):
        kube_up(clash)
    assert kube_status(clash) == []


@pytest.mark.parametrize("flag", ["--kube", "--k8s"])
def test_cli_up_kube_flag_and_alias(flag: str) -> None:
    assert build_parser(["stack", "up", flag]).parse_args(["stack", "up", flag]).kube is True
    assert build_parser(["stack", "up"]).parse_args(["stack", "up"]).kube is False

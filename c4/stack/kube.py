"""The stack's Kubernetes API server: etcd and a real kube-apiserver on 127.0.0.1 (no kubelet,
scheduler or controller-manager), for the actions' Kubernetes driver and its tests.

etcd is Debian's ``etcd-server`` (apt-installed when root and missing). kube-apiserver is
``C4_KUBE_APISERVER``, else ``shared/k8s/kube-apiserver`` beside the repository, else a build
cached in ``<stack_dir>/k8s/bin``, else built there with Go from ``scripts/k8s`` (a cold build
takes about 18 minutes on 2 cores). Both run under our pid files, with etcd's data (emptied
whenever etcd starts), the serving certificate (``certs/apiserver.crt``, its own CA), the keys,
tokens (users ``admin``: system:masters, ``c4-actions``: no group), kubeconfigs and logs in
``<stack_dir>/run/kube-<port>/``."""

from __future__ import annotations

import csv
import os
import secrets
import shutil
import signal
import ssl
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from c4.stack.supervise import (
    HOST,
    Component,
    ComponentStatus,
    Progress,
    StackError,
    component_status,
    installed,
    locked,
    our_pid,
    run_tool,
    spawn,
    stop_pid,
    taken_port,
    wait_ready,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from c4.settings import Settings

KUBE_VERSION = "v1.37.2"
REPO_ROOT = Path(__file__).resolve().parents[2]  # an editable install: the checkout
GO_MODULE_DIR = REPO_ROOT / "scripts" / "k8s"
SHARED_APISERVER = REPO_ROOT.parent / "shared" / "k8s" / "kube-apiserver"
APISERVER_ENV = "C4_KUBE_APISERVER"
ADMIN = "admin"
ACTIONS_USER = "c4-actions"
USERS = {ADMIN: "system:masters", ACTIONS_USER: ""}  # user: its group, if any
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
GO_TIMEOUT_S = 3600.0
_ETCD_HINT = "etcd not found: run sudo apt-get install -y etcd-server"
_OPENSSL_HINT = "openssl not found: run sudo apt-get install -y openssl"
# Without the version, `kubectl version` cannot parse the server's "v0.0.0-master+$Format:%H$".
_VERSION_VAR = "-X k8s.io/component-base/version.git"
_LDFLAGS = (
    f"-s -w {_VERSION_VAR}Version={KUBE_VERSION} {_VERSION_VAR}Major=1 {_VERSION_VAR}Minor=37"
)


def run_dir(settings: Settings) -> Path:
    """etcd's data, the certificates, keys, tokens, kubeconfigs, logs and pid files."""
    return settings.stack_dir / "run" / f"kube-{settings.stack_kube_port}"


def ca_path(settings: Settings) -> Path:
    """The serving certificate the apiserver generates; it is its own CA."""
    return run_dir(settings) / "certs" / "apiserver.crt"


def components(settings: Settings) -> list[Component]:
    """etcd (client, then peer port) and kube-apiserver, in start order."""
    folder = run_dir(settings)
    etcd = settings.stack_etcd_port
    return [
        Component("etcd", folder, ((etcd, "C4_STACK_ETCD_PORT"), (etcd + 1, "C4_STACK_ETCD_PORT"))),
        Component("kube-apiserver", folder, ((settings.stack_kube_port, "C4_STACK_KUBE_PORT"),)),
    ]


# --- the kube-apiserver binary -----------------------------------------------------------------


def cached_apiserver(settings: Settings) -> Path:
    """Where a build of ours is kept (shared by every port of this stack folder)."""
    return settings.stack_dir / "k8s" / "bin" / "kube-apiserver"


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_apiserver(settings: Settings) -> Path | None:
    """``C4_KUBE_APISERVER``, else shared/k8s beside the repository, else our cached build."""
    explicit = os.environ.get(APISERVER_ENV, "")
    if explicit and not _executable(Path(explicit)):
        message = f"{APISERVER_ENV}={explicit} is not an executable file"
        raise StackError(message)
    if explicit:
        return Path(explicit).resolve()
    for candidate in (SHARED_APISERVER, cached_apiserver(settings)):
        if _executable(candidate):
            return candidate.resolve()
    return None


def go_build_steps(go: str, module: Path, output: Path) -> list[tuple[str, list[str]]]:
    """The recipe's steps (scripts/k8s), each ``go -C <module> ...``: (what, argv)."""
    return [
        ("go mod download", [go, "-C", str(module), "mod", "download", "-json",
                             f"k8s.io/kubernetes@{KUBE_VERSION}"]),
        ("go mod tidy", [go, "-C", str(module), "mod", "tidy"]),
        ("go build", [go, "-C", str(module), "build", "-trimpath", f"-ldflags={_LDFLAGS}",
                      "-o", str(output), "k8s.io/kubernetes/cmd/kube-apiserver"]),
    ]  # fmt: skip


def build_apiserver(settings: Settings, progress: Progress | None = None) -> Path:
    """Build kube-apiserver with Go from scripts/k8s into the cache; its path."""
    target = cached_apiserver(settings)
    go = shutil.which("go")
    if go is None:
        message = (
            f"kube-apiserver not found and Go is missing to build it: install Go >= 1.26"
            f" or set {APISERVER_ENV} to a kube-apiserver {KUBE_VERSION} binary"
        )
        raise StackError(message)
    if not (GO_MODULE_DIR / "go.mod").is_file():
        message = f"kube-apiserver not found and no Go module to build it in {GO_MODULE_DIR}"
        raise StackError(message)
    folder = target.parent.parent
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder / ".lock"):
        if _executable(target):  # another process built it while we waited
            return target
        module = folder / "mod"
        shutil.rmtree(module, ignore_errors=True)
        shutil.copytree(GO_MODULE_DIR, module)
        target.parent.mkdir(exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        note = progress or (lambda _line: None)
        note(f"kube-apiserver: building {KUBE_VERSION} with {go} in {module}"
             " (a cold build takes about 18 min on 2 cores, a warm one 10 s)")  # fmt: skip
        for what, argv in go_build_steps(go, module, partial):
            began = time.monotonic()
            note(f"kube-apiserver: {what}...")
            log = folder / f"{what.replace(' ', '-')}.log"
            run_tool(argv, log, GO_TIMEOUT_S, f"{what} of kube-apiserver")
            note(f"kube-apiserver: {what} done in {time.monotonic() - began:.0f} s")
        partial.replace(target)
    return target


# --- credentials and kubeconfigs ---------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner only, atomically."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    temporary.replace(path)


def render_token_csv(tokens: dict[str, str]) -> str:
    """The apiserver's ``--token-auth-file``: ``token,user,uid[,"groups"]`` per user."""
    lines = []
    for user, token in tokens.items():
        group = USERS.get(user, "")
        lines.append(f"{token},{user},{user}" + (f',"{group}"' if group else ""))
    return "\n".join(lines) + "\n"


def _tokens(settings: Settings) -> dict[str, str]:
    path = run_dir(settings) / "pki" / "token.csv"
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            return {row[1]: row[0] for row in csv.reader(handle) if len(row) >= 3}
    except OSError as error:
        message = f"no Kubernetes credentials in {path.parent}: run `c4 stack up --kube` first"
        raise StackError(message) from error


def _ensure_credentials(settings: Settings) -> None:
    """The service-account key pair and the static tokens, made once per run folder."""
    pki = run_dir(settings) / "pki"
    pki.mkdir(mode=0o700, exist_ok=True)
    key, public = pki / "sa.key", pki / "sa.pub"
    if not (key.is_file() and public.is_file()):
        openssl = installed("openssl", ("openssl",), _OPENSSL_HINT)
        log = pki / "openssl.log"
        run_tool([openssl, "genrsa", "-out", str(key), "2048"], log, 60, "openssl genrsa")
        run_tool([openssl, "rsa", "-in", str(key), "-pubout", "-out", str(public)], log, 60,
                 "openssl rsa -pubout")  # fmt: skip
    key.chmod(0o600)
    public.chmod(0o600)
    tokens = pki / "token.csv"
    if not tokens.is_file():
        _write_private(tokens, render_token_csv({user: secrets.token_hex(24) for user in USERS}))


def render_kubeconfig(server: str, ca: Path, user: str, token: str) -> str:
    """A kubeconfig of one cluster, one user (a bearer token) and the context joining them."""
    cluster = {"server": server, "certificate-authority": str(ca)}
    context = {"cluster": "c4-local", "user": user}
    config = {"apiVersion": "v1", "kind": "Config", "preferences": {},
              "clusters": [{"name": "c4-local", "cluster": cluster}],
              "users": [{"name": user, "user": {"token": token}}],
              "contexts": [{"name": f"{user}@c4-local", "context": context}],
              "current-context": f"{user}@c4-local"}  # fmt: skip
    return yaml.safe_dump(config, sort_keys=False)


def kubeconfig_path(settings: Settings, user: str = ADMIN) -> Path:
    """Write (again) and return the kubeconfig of ``user`` (admin or c4-actions)."""
    tokens = _tokens(settings)
    if user not in tokens:
        message = f"no Kubernetes user {user!r} in this stack (users: {', '.join(tokens)})"
        raise StackError(message)
    server = f"https://{HOST}:{settings.stack_kube_port}"
    path = run_dir(settings) / f"kubeconfig-{user}.yaml"
    _write_private(path, render_kubeconfig(server, ca_path(settings), user, tokens[user]))
    return path


# --- processes ---------------------------------------------------------------------------------


def etcd_argv(settings: Settings, etcd: str) -> list[str]:
    """etcd as RECIPE.md starts it, on this stack's ports and folder."""
    client = f"http://{HOST}:{settings.stack_etcd_port}"
    peer = f"http://{HOST}:{settings.stack_etcd_port + 1}"
    return [
        etcd,
        "--name=c4",
        f"--data-dir={run_dir(settings) / 'etcd-data'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=c4={peer}",
    ]


def apiserver_argv(settings: Settings, binary: Path) -> list[str]:
    """kube-apiserver as start-apiserver.sh starts it, on this stack's ports and folder."""
    folder = run_dir(settings)
    pki = folder / "pki"
    return [
        str(binary),
        f"--etcd-servers=http://{HOST}:{settings.stack_etcd_port}",
        f"--bind-address={HOST}",
        f"--advertise-address={HOST}",
        f"--secure-port={settings.stack_kube_port}",
        # The default reconciler refuses a loopback address.
        "--endpoint-reconciler-type=none",
        f"--cert-dir={folder / 'certs'}",
        f"--token-auth-file={pki / 'token.csv'}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/24",
        # No controller-manager creates the "default" service account.
        "--disable-admission-plugins=ServiceAccount",
    ]


def _get(url: str, timeout_s: float, token: str = "", ca: Path | None = None) -> bytes | None:
    """The body of a 200 answer to GET ``url``; None for anything else."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - our http(s) URLs
    context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as answer:  # noqa: S310
            body: bytes = answer.read()
            return body if answer.status == 200 else None
    except (OSError, ValueError):  # URLError, ssl and socket errors are OSErrors
        return None


def _prober(settings: Settings, name: str) -> Callable[[float], bool]:
    def probe(timeout_s: float) -> bool:
        if name == "etcd":  # {"health":"true"} (3.4), {"health":"true","reason":""} (3.5)
            body = _get(f"http://{HOST}:{settings.stack_etcd_port}/health", timeout_s)
            return body is not None and b'"health":"true"' in body
        ca = ca_path(settings)
        if not ca.is_file():  # written by the apiserver once it starts serving
            return False
        url = f"https://{HOST}:{settings.stack_kube_port}/readyz"
        body = _get(url, timeout_s, _tokens(settings)[ADMIN], ca)
        return body is not None and body.strip() == b"ok"

    return probe


def kube_up(settings: Settings, progress: Progress | None = None) -> list[ComponentStatus]:
    """Start etcd and kube-apiserver unless ours already run (reused); return once /readyz is
    ok, both users' kubeconfigs written. A port held by another process, or no kube-apiserver
    and no way to build one, is a StackError before anything starts."""
    if settings.stack_kube_port - settings.stack_etcd_port in (0, 1):
        message = "C4_STACK_KUBE_PORT must differ from C4_STACK_ETCD_PORT and the port after it"
        raise StackError(message)
    daemons = components(settings)
    etcd, apiserver = daemons
    folder, note = run_dir(settings), progress or (lambda _line: None)
    folder.mkdir(parents=True, exist_ok=True)
    with locked(etcd.lock_file):
        running = {c.name: pid for c in daemons if (pid := our_pid(c)) is not None}
        if etcd.name not in running and apiserver.name in running:
            # A new etcd starts empty: the apiserver must start again (and would not shut down
            # gracefully within STOP_TIMEOUT_S without its etcd).
            stop_pid(apiserver, running.pop(apiserver.name), STOP_TIMEOUT_S, signal.SIGKILL)
        for component in daemons:
            taken = None if component.name in running else taken_port(component)
            if taken is not None:
                message = f"port {taken[0]} on {HOST} is taken: stop it or set {taken[1]}"
                raise StackError(message)
        argvs: dict[str, list[str]] = {}
        if etcd.name not in running:
            argvs[etcd.name] = etcd_argv(settings, installed("etcd", ("etcd-server",), _ETCD_HINT))
        if apiserver.name not in running:
            binary = find_apiserver(settings) or build_apiserver(settings, progress)
            argvs[apiserver.name] = apiserver_argv(settings, binary)
        _ensure_credentials(settings)
        statuses = []
        for component in daemons:
            began, pid = time.monotonic(), running.get(component.name)
            detail = "already running"
            if pid is None:
                if component is etcd:
                    shutil.rmtree(folder / "etcd-data", ignore_errors=True)
                pid = spawn(argvs[component.name], component.log_file, component.pid_file)
                note(f"{component.name}: started pid {pid}, waiting for {component.address}")
            wait_ready(component, pid, _prober(settings, component.name), READY_TIMEOUT_S)
            if component.name not in running:
                detail = f"started in {time.monotonic() - began:.1f} s, log {component.log_file}"
            statuses.append(
                ComponentStatus(component.name, "running", pid, component.address, detail)
            )
        for user in USERS:
            kubeconfig_path(settings, user)
    return statuses


def kube_down(settings: Settings) -> list[ComponentStatus]:
    """Stop the kube-apiserver, then etcd, that ``kube_up`` started; idempotent."""
    daemons = components(settings)
    if not run_dir(settings).is_dir():
        return [component_status(c) for c in daemons]
    statuses = []
    with locked(daemons[0].lock_file):
        for component in reversed(daemons):
            pid = our_pid(component)
            if pid is None:
                component.pid_file.unlink(missing_ok=True)
                statuses.append(component_status(component))
                continue
            statuses.append(stop_pid(component, pid, STOP_TIMEOUT_S))
    return list(reversed(statuses))


def kube_status(settings: Settings) -> list[ComponentStatus]:
    """Each process's state; empty when this stack's Kubernetes was never started."""
    if not run_dir(settings).is_dir():
        return []
    return [component_status(c) for c in components(settings)]

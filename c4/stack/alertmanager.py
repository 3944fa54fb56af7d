"""A local Alertmanager: Debian's ``prometheus-alertmanager`` on 127.0.0.1, for c4's alerts.

The action worker's ``kind: alertmanager`` receivers post to its v2 API; its routes, grouping,
inhibition and silences then decide who hears of what. It runs under our pid file with its
configuration (``alertmanager.yml``), its storage (silences, notification log), log and pid
file in ``<stack_dir>/run/alertmanager-<port>/``, alone (no cluster gossip). The program is
apt-installed when root and missing. `render_alertmanager_config` writes a configuration
that routes every alert to webhooks (or to nobody: alerts and silences are then only seen in
its API and web UI).
"""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
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
    spawn,
    stop_ours,
    taken_port,
    wait_ready,
)

if TYPE_CHECKING:
    from c4.settings import Settings

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
CONFIG_NAME = "alertmanager.yml"
# The training job is ``training_job`` on c4's alerts, from the worker and from Prometheus's
# rules alike (``job`` is the scrape job's there).
DEFAULT_GROUP_BY = ("alertname", "training_job", "node")
_HINT = "prometheus-alertmanager not found: run sudo apt-get install -y prometheus-alertmanager"


def alertmanager_component(settings: Settings) -> Component:
    """Alertmanager's run folder and web port."""
    port = settings.stack_alertmanager_port
    return Component(
        "alertmanager",
        settings.stack_dir / "run" / f"alertmanager-{port}",
        ((port, "C4_STACK_ALERTMANAGER_PORT"),),
    )


def alertmanager_url(settings: Settings) -> str:
    """The base URL a ``kind: alertmanager`` receiver names."""
    return f"http://{HOST}:{settings.stack_alertmanager_port}"


def config_path(settings: Settings) -> Path:
    """The configuration file the Alertmanager reads (written by `alertmanager_up`)."""
    return alertmanager_component(settings).run_dir / CONFIG_NAME


def _duration(seconds: float) -> str:
    """Alertmanager's duration: whole seconds as ``30s``, else milliseconds (``250ms``)."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def render_alertmanager_config(
    webhooks: Sequence[str] = (),
    group_by: Sequence[str] = DEFAULT_GROUP_BY,
    group_wait_s: float = 10.0,
    group_interval_s: float = 30.0,
    repeat_interval_s: float = 4 * 3600.0,
) -> str:
    """An Alertmanager configuration: one route, every alert to ``webhooks`` (resolutions too);
    with none, to a receiver that notifies nobody."""
    receiver: dict[str, object] = {"name": "c4-webhooks" if webhooks else "c4-nobody"}
    if webhooks:
        receiver["webhook_configs"] = [{"url": url, "send_resolved": True} for url in webhooks]
    config = {
        "route": {
            "receiver": receiver["name"],
            "group_by": list(group_by),
            "group_wait": _duration(group_wait_s),
            "group_interval": _duration(group_interval_s),
            "repeat_interval": _duration(repeat_interval_s),
        },
        "receivers": [receiver],
    }
    return yaml.safe_dump(config, sort_keys=False)


def _binary() -> str:
    # Debian names it prometheus-alertmanager; an upstream release's binary is alertmanager.
    upstream = shutil.which("alertmanager")
    if upstream is not None and shutil.which("prometheus-alertmanager") is None:
        return upstream
    return installed("prometheus-alertmanager", ("prometheus-alertmanager",), _HINT)


def alertmanager_argv(settings: Settings, binary: str) -> list[str]:
    """The Alertmanager of this stack: its port, its folder, no gossip."""
    folder = alertmanager_component(settings).run_dir
    return [
        binary,
        f"--config.file={folder / CONFIG_NAME}",
        f"--storage.path={folder / 'data'}",
        f"--web.listen-address={HOST}:{settings.stack_alertmanager_port}",
        f"--web.external-url={alertmanager_url(settings)}",
        "--cluster.listen-address=",
        "--log.level=info",
    ]


def _request(url: str, timeout_s: float, method: str = "GET") -> tuple[int | None, str]:
    request = urllib.request.Request(url, method=method)  # noqa: S310 - our http URL
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310
            return int(answer.status), answer.read(400).decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read(400).decode(errors="replace").strip()
    except OSError as error:
        return None, str(error)


def alertmanager_probe(settings: Settings) -> Callable[[float], bool]:
    """A readiness check: True once ``/-/ready`` answers 200."""

    def probe(timeout_s: float) -> bool:
        status, _ = _request(f"{alertmanager_url(settings)}/-/ready", timeout_s)
        return status == 200

    return probe


def _write_config(path: Path, text: str) -> bool:
    """Write the configuration atomically; whether it changed."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
    return True


def alertmanager_up(
    settings: Settings, config: str | None = None, progress: Progress | None = None
) -> ComponentStatus:
    """Start the Alertmanager unless ours runs (then it is reused, and reloaded when
    ``config`` changed its configuration); return once ``/-/ready`` answers. ``config``: the
    configuration's YAML (None: keep the folder's, else `render_alertmanager_config`'s)."""
    component = alertmanager_component(settings)
    component.run_dir.mkdir(parents=True, exist_ok=True)
    path = component.run_dir / CONFIG_NAME
    with locked(component.lock_file):
        pid = our_pid(component)
        if pid is None:
            taken = taken_port(component)
            if taken is not None:
                message = f"port {taken[0]} on {HOST} is taken: stop it or set {taken[1]}"
                raise StackError(message)
        if config is not None or not path.is_file():
            changed = _write_config(path, config or render_alertmanager_config())
        else:
            changed = False
        if pid is not None:
            detail = "already running"
            if changed:
                _reload(settings, component)
                detail += ", configuration reloaded"
            return ComponentStatus(component.name, "running", pid, component.address, detail)
        argv = alertmanager_argv(settings, _binary())
        began = time.monotonic()
        pid = spawn(argv, component.log_file, component.pid_file)
        if progress is not None:
            progress(f"alertmanager: started pid {pid}, waiting for {component.address}")
        wait_ready(component, pid, alertmanager_probe(settings), READY_TIMEOUT_S)
        detail = f"started in {time.monotonic() - began:.1f} s, log {component.log_file}"
        return ComponentStatus(component.name, "running", pid, component.address, detail)


def _reload(settings: Settings, component: Component) -> None:
    status, text = _request(f"{alertmanager_url(settings)}/-/reload", 10.0, "POST")
    if status != 200:
        message = (
            f"alertmanager did not take its new configuration ({status or 'no answer'}:"
            f" {text or 'no reason given'}; log {component.log_file})"
        )
        raise StackError(message)


def alertmanager_down(settings: Settings) -> ComponentStatus:
    """Stop the Alertmanager that `alertmanager_up` started; idempotent."""
    return stop_ours(alertmanager_component(settings), STOP_TIMEOUT_S)


def alertmanager_status(settings: Settings) -> ComponentStatus:
    """What runs on the Alertmanager's port: ours, a stale pid file, another process, nothing."""
    return component_status(alertmanager_component(settings))

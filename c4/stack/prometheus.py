"""A Prometheus for c4's workers: Debian's ``prometheus`` (apt-installed when root and missing),
started under our pid file on 127.0.0.1, scraping the workers and evaluating c4's rules.

Its config (``prometheus.yml``: one scrape job per worker kind, each reading its targets from
``targets/<job>.json``, and the rule files), its TSDB (``data/``), log and pid file live in
``<stack_dir>/run/prometheus-<port>/``. Targets can change while it runs (`set_targets`:
the demo's workers take free ports); a config written for a Prometheus that already runs is
loaded by SIGHUP. ``promtool`` (the same package) checks and unit-tests rule files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    send_signal,
    spawn,
    stop_ours,
    taken_port,
    wait_ready,
)

if TYPE_CHECKING:
    from c4.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]  # an editable install: the checkout
RULES_FILE = REPO_ROOT / "deploy" / "prometheus" / "c4-rules.yml"
RULES_TEST_FILE = REPO_ROOT / "deploy" / "prometheus" / "c4-rules.test.yml"
STREAMS_JOB = "c4-streams"  # the scrape job names c4-rules.yml expects
ACTIONS_JOB = "c4-actions"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
PROMTOOL_TIMEOUT_S = 60.0
_HINT = "prometheus not found: run sudo apt-get install -y prometheus"
_PROMTOOL_HINT = "promtool not found: run sudo apt-get install -y prometheus"


@dataclass(frozen=True, slots=True)
class ScrapeSetup:
    """What the Prometheus scrapes and evaluates: targets (``host:port``) by job, rule files,
    and how often (short intervals for tests, Prometheus's usual 15 s otherwise)."""

    targets: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {STREAMS_JOB: (f"{HOST}:9464",), ACTIONS_JOB: (f"{HOST}:9465",)}
    )
    rule_files: tuple[Path, ...] = (RULES_FILE,)
    scrape_interval_s: float = 15.0
    evaluation_interval_s: float = 15.0
    alertmanagers: tuple[str, ...] = ()  # host:port of Alertmanagers to send alerts to


def prometheus_component(settings: Settings) -> Component:
    """The Prometheus's run folder and web port."""
    port = settings.stack_prometheus_port
    return Component(
        "prometheus",
        settings.stack_dir / "run" / f"prometheus-{port}",
        ((port, "C4_STACK_PROMETHEUS_PORT"),),
    )


def prometheus_binary() -> str:
    """The path of ``prometheus`` (Debian's package installed first when root and missing)."""
    return installed("prometheus", ("prometheus",), _HINT)


def promtool() -> str:
    """The path of ``promtool`` (from Debian's ``prometheus`` package, as above)."""
    return installed("promtool", ("prometheus",), _PROMTOOL_HINT)


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _targets_file(component: Component, job: str) -> Path:
    return component.run_dir / "targets" / f"{job}.json"


def render_config(component: Component, setup: ScrapeSetup) -> str:
    """``prometheus.yml``: the global intervals, the rule files, a job per ``setup.targets``
    whose targets come from its file (see `set_targets`), the Alertmanagers if any."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": _duration(setup.scrape_interval_s),
            "scrape_timeout": _duration(min(10.0, setup.scrape_interval_s)),
            "evaluation_interval": _duration(setup.evaluation_interval_s),
        },
        "rule_files": [str(path.resolve()) for path in setup.rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "file_sd_configs": [
                    {
                        "files": [str(_targets_file(component, job))],
                        "refresh_interval": _duration(max(1.0, setup.scrape_interval_s)),
                    }
                ],
            }
            for job in setup.targets
        ],
    }
    if setup.alertmanagers:
        targets = list(setup.alertmanagers)
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": targets}]}]}
    return yaml.safe_dump(config, sort_keys=False)


def _write(path: Path, text: str) -> None:
    """Replace ``path`` at once: Prometheus never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def set_targets(settings: Settings, job: str, targets: tuple[str, ...]) -> None:
    """Scrape ``targets`` (``host:port``) as ``job`` from now on (read within a second or
    two by a running Prometheus; the job must be one of its setup's)."""
    document = [{"targets": list(targets), "labels": {}}]
    _write(_targets_file(prometheus_component(settings), job), json.dumps(document) + "\n")


def prometheus_argv(component: Component, binary: str) -> list[str]:
    """The command line: config, TSDB and listen address, all ours."""
    return [
        binary,
        f"--config.file={component.run_dir / 'prometheus.yml'}",
        f"--storage.tsdb.path={component.run_dir / 'data'}",
        f"--web.listen-address={component.address}",
    ]


def api(settings: Settings, path: str, timeout_s: float = 5.0, **params: str) -> Any:
    """The ``data`` of a Prometheus HTTP API answer (``/api/v1/...``); StackError otherwise."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    url = f"http://{HOST}:{settings.stack_prometheus_port}{path}{query}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # noqa: S310 - loopback
            body = json.loads(answer.read())
    except (OSError, ValueError) as error:
        message = f"prometheus at {HOST}:{settings.stack_prometheus_port}: {path}: {error}"
        raise StackError(message) from error
    if body.get("status") != "success":
        message = f"prometheus {path}: {body.get('error', body)}"
        raise StackError(message)
    return body.get("data")


def _ready_probe(component: Component) -> Callable[[float], bool]:
    url = f"http://{component.address}/-/ready"

    def probe(timeout_s: float) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # noqa: S310
                return bool(answer.status == 200)
        except (OSError, ValueError):
            return False

    return probe


def prometheus_up(
    settings: Settings, setup: ScrapeSetup | None = None, progress: Progress | None = None
) -> ComponentStatus:
    """Write the config and targets, start Prometheus unless ours runs (then it reloads the
    config: SIGHUP); return once ``/-/ready`` answers. A port held by another process is a
    StackError before anything starts."""
    setup = setup or ScrapeSetup()
    component = prometheus_component(settings)
    component.run_dir.mkdir(parents=True, exist_ok=True)
    with locked(component.lock_file):
        pid = our_pid(component)
        if pid is None and (taken := taken_port(component)) is not None:
            message = f"port {taken[0]} on {HOST} is taken: stop it or set {taken[1]}"
            raise StackError(message)
        binary = prometheus_binary() if pid is None else ""
        for job, targets in setup.targets.items():
            set_targets(settings, job, targets)
        _write(component.run_dir / "prometheus.yml", render_config(component, setup))
        began = time.monotonic()
        if pid is not None:
            send_signal(component, pid, signal.SIGHUP)
            detail = f"already running, config reloaded, log {component.log_file}"
        else:
            pid = spawn(prometheus_argv(component, binary), component.log_file, component.pid_file)
            if progress is not None:
                progress(f"prometheus: started pid {pid}, waiting for {component.address}")
            detail = ""
        wait_ready(component, pid, _ready_probe(component), READY_TIMEOUT_S)
        if not detail:
            detail = f"started in {time.monotonic() - began:.1f} s, log {component.log_file}"
    return ComponentStatus(component.name, "running", pid, component.address, detail)


def prometheus_down(settings: Settings) -> ComponentStatus:
    """Stop the Prometheus that `prometheus_up` started (by pid file); idempotent."""
    return stop_ours(prometheus_component(settings), STOP_TIMEOUT_S)


def prometheus_status(settings: Settings) -> ComponentStatus:
    """Whether our Prometheus runs (or something else holds its port)."""
    return component_status(prometheus_component(settings))


def run_promtool(*args: str, cwd: Path | None = None) -> str:
    """``promtool ARGS``'s output; StackError with that output when it fails."""
    argv = [promtool(), *args]
    try:
        result = subprocess.run(  # noqa: S603 - fixed argv built here, no shell
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PROMTOOL_TIMEOUT_S,
            check=False,
            env={**os.environ, "NO_COLOR": "1"},
        )
    except subprocess.TimeoutExpired as error:
        message = f"promtool {' '.join(args)} did not finish within {PROMTOOL_TIMEOUT_S:.0f} s"
        raise StackError(message) from error
    output = result.stdout + result.stderr
    if result.returncode != 0:
        message = f"promtool {' '.join(args)} failed:\n{output}"
        raise StackError(message)
    return output


def check_rules(*rule_files: Path) -> str:
    """``promtool check rules``: the files parse and every expression is valid PromQL."""
    return run_promtool("check", "rules", *(str(path) for path in rule_files))


def rule_tests(test_file: Path) -> str:
    """``promtool test rules``: the rules give the alerts the test file expects (rule files
    named in it are relative to its folder)."""
    return run_promtool("test", "rules", test_file.name, cwd=test_file.parent)

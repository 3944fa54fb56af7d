"""A real Prometheus (Debian's, under `c4.stack.prometheus`) scrapes the demo's streams and
actions workers while ``c4 demo`` injects its faults on the real broker and Redis: c4's rules
fire on the findings, with c4's labels, and reach a real Alertmanager (its API lists them);
every panel of the Grafana dashboard draws data; once the workers stop, the worker-down rule
sees it.
And ``--metrics-address`` / ``C4_METRICS_ADDRESS`` move where a worker serves /metrics."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from c4.demo.processes import free_port
from c4.settings import Settings, load_settings
from c4.stack.alertmanager import alertmanager_down, alertmanager_up, alertmanager_url
from c4.stack.prometheus import (
    ACTIONS_JOB,
    STREAMS_JOB,
    ScrapeSetup,
    api,
    prometheus_down,
    prometheus_status,
    prometheus_up,
    set_targets,
)
from tests.integration.test_demo_cli import SCENARIO as DEMO_SCENARIO

pytestmark = pytest.mark.integration

# The demo test's small scenario: a stuck process in job-b, a degraded port on node-001.
SCENARIO = {**DEMO_SCENARIO, "name": "prometheus-demo"}
# The alerts the two faults must raise, with the labels c4 puts on them.
EXPECTED = {
    "C4JobHang": {
        "class": "noncomm_hang",
        "training_job": "job-b",
        "suspect": "node-005/gpu1",
        "suspect_type": "gpu",
        "node": "node-005",
        "Hostname": "node-005",
        "gpu": "1",
        "job": STREAMS_JOB,
        "severity": "critical",
    },
    "C4LinkDegraded": {
        "class": "link_degraded",
        "suspect": "node-001/mlx5_2:1",
        "suspect_type": "port",
        "node": "node-001",
        "Hostname": "node-001",
        "device": "mlx5_2",
        "port": "1",
        "job": STREAMS_JOB,
        "severity": "warning",
    },
}
WORKERS = re.compile(
    r"workers: streams \(pid \d+, metrics :(\d+)\), actions \(pid \d+, metrics :(\d+)\)"
)


def _dashboard_panels() -> dict[str, list[str]]:
    """The Grafana dashboard's panels and their PromQL, Grafana's rate interval made
    concrete."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "build_dashboard.py"
    spec = importlib.util.spec_from_file_location("build_dashboard", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return {
        panel.title: [query.expr.replace("$__rate_interval", "1m") for query in panel.queries]
        for panel in module.PANELS
    }


def _listed(manager: str) -> list[dict[str, Any]]:
    """The alerts Alertmanager's v2 API lists (active, with their labels)."""
    with urllib.request.urlopen(f"{manager}/api/v2/alerts", timeout=5) as answer:  # noqa: S310
        listed: list[dict[str, Any]] = orjson.loads(answer.read())
    return listed


def _firing(settings: Settings) -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = api(settings, "/api/v1/alerts")["alerts"]
    return [alert for alert in alerts if alert["state"] == "firing"]


def _matches(alert: dict[str, Any], name: str) -> bool:
    labels = alert["labels"]
    wanted = EXPECTED[name]
    return labels.get("alertname") == name and all(labels.get(k) == v for k, v in wanted.items())


def test_prometheus_alerts_on_the_demo_faults_with_c4_labels(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path
) -> None:
    settings = load_settings(
        stack_dir=tmp_path / "stack",
        stack_prometheus_port=free_port(),
        stack_alertmanager_port=free_port(),
    )
    # Prometheus sends its alerts to a real Alertmanager, as in a monitoring stack.
    assert alertmanager_up(settings).state == "running"
    manager = alertmanager_url(settings)
    setup = ScrapeSetup(
        targets={STREAMS_JOB: (), ACTIONS_JOB: ()},
        scrape_interval_s=0.5,
        evaluation_interval_s=0.5,
        alertmanagers=(manager.removeprefix("http://"),),
    )
    status = prometheus_up(settings, setup)
    assert status.state == "running", status
    again = prometheus_up(settings, setup)  # ours runs: reused, its config reloaded
    assert again.pid == status.pid and again.detail.startswith("already running"), again
    scenario = tmp_path / "scenario.json"
    scenario.write_bytes(orjson.dumps(SCENARIO))
    report = tmp_path / "report"
    env = dict(
        os.environ,
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        C4_REDIS_URL=redis_url,
        C4_TOPIC_PREFIX=f"test.{unique}.",
        C4_REDIS_KEY_PREFIX=f"test:{unique}",
        PYTHONUNBUFFERED="1",
    )
    argv = [sys.executable, "-m", "c4.cli", "demo", "--scenario", str(scenario)]
    argv += ["--nodes", "8", "--spines", "2", "--report", str(report), "--no-dashboard"]
    out_file = tmp_path / "demo.out"
    seen: dict[str, dict[str, Any]] = {}
    managed: set[str] = set()  # the expected alerts as Alertmanager's API lists them
    ports: tuple[int, int] | None = None
    # Every query of the Grafana dashboard is valid PromQL (Prometheus refuses others), and
    # every panel draws data at some point of the demo.
    queries = _dashboard_panels()
    panels = dict.fromkeys(queries, False)
    asked_at = 0.0
    try:
        with out_file.open("wb") as out:
            demo = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                deadline = time.monotonic() + 240
                while demo.poll() is None and time.monotonic() < deadline:
                    if ports is None and (found := WORKERS.search(out_file.read_text())):
                        ports = int(found[1]), int(found[2])
                        # The demo's workers took free ports: Prometheus reads them from now on.
                        set_targets(settings, STREAMS_JOB, (f"127.0.0.1:{ports[0]}",))
                        set_targets(settings, ACTIONS_JOB, (f"127.0.0.1:{ports[1]}",))
                    for alert in _firing(settings):
                        for name in EXPECTED:
                            if _matches(alert, name):
                                seen.setdefault(name, alert)
                    for alert in _listed(manager):
                        managed.update(name for name in EXPECTED if _matches(alert, name))
                    if ports is not None and time.monotonic() - asked_at > 2:
                        asked_at = time.monotonic()
                        for title, exprs in queries.items():
                            for expr in exprs:
                                if api(settings, "/api/v1/query", query=expr)["result"]:
                                    panels[title] = True
                    time.sleep(0.25)
            finally:
                if demo.poll() is None:
                    demo.terminate()
                demo.wait(60)
        output = out_file.read_text()
        assert demo.returncode == 0, output[-4000:]
        assert ports is not None, output[-2000:]
        assert set(seen) == set(EXPECTED), (seen, _firing(settings))
        assert managed == set(EXPECTED), (managed, _listed(manager))
        assert all(panels.values()), [title for title, drawn in panels.items() if not drawn]
        hang = seen["C4JobHang"]["labels"]
        assert hang["diagnosis"].startswith("d-") and hang["instance"] == f"127.0.0.1:{ports[0]}"
        assert "device" not in hang and "port" not in hang  # empty labels: none at all
        # Both workers were scraped (up == 1 at some point); the ALERTS series kept the history.
        for job in (STREAMS_JOB, ACTIONS_JOB):
            result = api(settings, "/api/v1/query", query=f'max_over_time(up{{job="{job}"}}[10m])')
            assert result["result"] and result["result"][0]["value"][1] == "1", (job, result)
        history = api(
            settings,
            "/api/v1/query",
            query='count by (alertname) (last_over_time(ALERTS{alertstate="firing"}[10m]))',
        )
        assert {r["metric"]["alertname"] for r in history["result"]} >= set(EXPECTED)
        # The demo stopped its workers: the worker-down rule sees both (pending for its 1m).
        deadline = time.monotonic() + 20
        down: set[str] = set()
        while time.monotonic() < deadline and down != {STREAMS_JOB, ACTIONS_JOB}:
            alerts = api(settings, "/api/v1/alerts")["alerts"]
            down = {
                a["labels"]["job"] for a in alerts if a["labels"]["alertname"] == "C4WorkerDown"
            }
            time.sleep(0.5)
        assert down == {STREAMS_JOB, ACTIONS_JOB}
    finally:
        stopped = prometheus_down(settings)
        alertmanager_down(settings)
    assert stopped.state == "stopped", stopped
    assert prometheus_status(settings).state == "stopped"


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.parametrize("how", ["option", "env"])
def test_metrics_address_moves_the_workers_endpoint(
    kafka_bootstrap: str, redis_url: str, unique: str, tmp_path: Path, how: str
) -> None:
    # 127.0.0.2 is loopback too, but not 127.0.0.1: a worker told to bind it answers there only.
    ports = free_port(), free_port()
    env = dict(
        os.environ,
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        C4_REDIS_URL=redis_url,
        C4_TOPIC_PREFIX=f"test.{unique}.",
        C4_REDIS_KEY_PREFIX=f"test:{unique}",
    )
    env.pop("C4_METRICS_ADDRESS", None)
    option: list[str] = []
    if how == "env":
        env["C4_METRICS_ADDRESS"] = "127.0.0.2"
    else:
        option = ["--metrics-address", "127.0.0.2"]
    c4 = [sys.executable, "-m", "c4.cli"]
    commands = [
        [*c4, "streams", "worker", "--app-id", f"test-{unique}", "--web-port", str(free_port())]
        + ["--metrics-port", str(ports[0]), "--loglevel", "warn", *option],
        [*c4, "actions", "worker", "--group", f"test-{unique}", "--metrics-port", str(ports[1])]
        + option,
    ]
    logs = [tmp_path / "streams.log", tmp_path / "actions.log"]
    workers = []
    try:
        for command, log in zip(commands, logs, strict=True):
            with log.open("wb") as handle:
                workers.append(
                    subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
                )
        for worker, port, log in zip(workers, ports, logs, strict=True):
            deadline = time.monotonic() + 60
            while not _answers("127.0.0.2", port):
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            assert not _answers("127.0.0.1", port)
            url = f"http://127.0.0.2:{port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - loopback
                assert b"c4_build_info{" in answer.read()
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)

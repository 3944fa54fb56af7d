"""``c4 stack up --monitoring``: Prometheus with c4's rules, sending to an Alertmanager."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from c4.cli import build_parser
from c4.demo.processes import free_port
from c4.settings import load_settings
from c4.stack import monitoring_down, monitoring_status, monitoring_up
from c4.stack.prometheus import api

pytestmark = pytest.mark.integration


def test_monitoring_up_runs_prometheus_with_c4s_rules_and_its_alertmanager(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        stack_dir=tmp_path / "stack",
        stack_prometheus_port=free_port(),
        stack_alertmanager_port=free_port(),
    )
    try:
        first = monitoring_up(settings)
        assert [s.state for s in first] == ["running", "running"], first
        again = monitoring_up(settings)  # ours run: reused
        assert [s.pid for s in again] == [s.pid for s in first]
        groups = api(settings, "/api/v1/rules")["groups"]
        alerts = {rule["name"] for group in groups for rule in group["rules"]}
        assert {"C4GpuFault", "C4WorkerDown", "C4LinkDown"} <= alerts
        deadline = time.monotonic() + 30
        active: list[dict[str, str]] = []
        while not active and time.monotonic() < deadline:
            active = api(settings, "/api/v1/alertmanagers")["activeAlertmanagers"]
            time.sleep(0.2)
        port = settings.stack_alertmanager_port
        assert [a["url"] for a in active] == [f"http://127.0.0.1:{port}/api/v2/alerts"]
    finally:
        stopped = monitoring_down(settings)
    assert {s.state for s in stopped} == {"stopped"}
    assert {s.state for s in monitoring_status(settings)} == {"stopped"}
    assert monitoring_down(settings) == []  # nothing of ours runs: nothing to stop


def test_the_flag_is_on_stack_up() -> None:
    args = build_parser().parse_args(["stack", "up", "--monitoring"])
    assert args.monitoring and not args.kube

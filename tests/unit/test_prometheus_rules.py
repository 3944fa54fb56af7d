"""deploy/prometheus/c4-rules.yml: valid for promtool, its unit tests pass, every alert is
tested firing; the Prometheus config c4 writes is valid. promtool is Debian's (apt-installed
by `c4.stack.prometheus.promtool` when root and missing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from c4.settings import load_settings
from c4.stack.prometheus import (
    ACTIONS_JOB,
    RULES_FILE,
    RULES_TEST_FILE,
    STREAMS_JOB,
    ScrapeSetup,
    check_rules,
    prometheus_component,
    render_config,
    rule_tests,
    run_promtool,
    set_targets,
)
from c4.stack.supervise import StackError


def test_rules_pass_promtool_check() -> None:
    assert "SUCCESS" in check_rules(RULES_FILE)


def test_rules_give_the_expected_alerts() -> None:
    assert "SUCCESS" in rule_tests(RULES_TEST_FILE)


def test_every_alert_is_tested_firing() -> None:
    rules = yaml.safe_load(RULES_FILE.read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    tests = yaml.safe_load(RULES_TEST_FILE.read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == fired


def test_a_broken_rule_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: sum(c4_finding_open\n"
    )
    with pytest.raises(StackError, match="promtool check rules"):
        check_rules(broken)


def test_the_written_config_passes_promtool(tmp_path: Path) -> None:
    settings = load_settings(stack_dir=tmp_path, stack_prometheus_port=19090)
    component = prometheus_component(settings)
    setup = ScrapeSetup(
        scrape_interval_s=1, evaluation_interval_s=0.5, alertmanagers=("127.0.0.1:19093",)
    )
    config_file = component.run_dir / "prometheus.yml"
    config_file.parent.mkdir(parents=True)
    config_file.write_text(render_config(component, setup))
    set_targets(settings, STREAMS_JOB, ("127.0.0.1:9464",))
    set_targets(settings, ACTIONS_JOB, ("127.0.0.1:9465", "10.0.0.2:9465"))
    config = yaml.safe_load(config_file.read_text())
    assert config["global"] == {
        "scrape_interval": "1000ms",
        "scrape_timeout": "1000ms",  # never longer than the interval: Prometheus refuses that
        "evaluation_interval": "500ms",
    }
    assert [job["job_name"] for job in config["scrape_configs"]] == [STREAMS_JOB, ACTIONS_JOB]
    assert config["rule_files"] == [str(RULES_FILE)]
    alerting = config["alerting"]["alertmanagers"]
    assert alerting == [{"static_configs": [{"targets": ["127.0.0.1:19093"]}]}]
    output = run_promtool("check", "config", str(config_file))
    assert "SUCCESS" in output and "17 rules found" in output

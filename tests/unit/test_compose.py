from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from c4.cli import build_parser

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEY", re.IGNORECASE)


def services() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    found: dict[str, Any] = document["services"]
    return found


def test_stack_services_present_with_health_checks() -> None:
    found = services()
    assert found["kafka"]["image"].startswith("apache/kafka:4.")
    assert "broker,controller" in found["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    assert found["redis"]["image"].startswith("redis:")
    for name in ("kafka", "redis"):
        assert found[name]["healthcheck"]["test"]


@pytest.mark.parametrize("name", sorted(services()))
def test_every_c4_command_exists(name: str) -> None:
    command = services()[name].get("command")
    if command is None or command[0] != "c4":
        assert name in {"kafka", "redis", "prometheus", "alertmanager", "grafana"}
        return
    # argparse exits (SystemExit) on an unknown subcommand or option.
    args = build_parser().parse_args(command[1:])
    assert callable(args.handler)


def test_no_hard_coded_secrets() -> None:
    for name, service in services().items():
        environment = service.get("environment") or {}
        for key, value in environment.items():
            if SECRET_NAME.search(key) and value:
                assert str(value).startswith("${"), f"{name}.{key} is hard-coded"


def test_demo_services_wired_together() -> None:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    found = document["services"]
    assert {"setup", "agent", "streams", "actions", "dashboard"} <= set(found)
    assert "127.0.0.1:8066:8066" in found["dashboard"]["ports"]
    assert found["agent"]["command"][:3] == ["c4", "simulate", "--kafka"]
    assert "--start-now" in found["agent"]["command"]
    assert "--follow-plans" in found["agent"]["command"]  # the fabric takes the reroutes
    for name, service in found.items():
        for needed in service.get("depends_on", {}):
            assert needed in found, f"{name} depends on unknown service {needed}"
        for volume in service.get("volumes", ()):
            source = volume.split(":")[0]
            if source.startswith("./"):  # a file of this repository, mounted read-only
                assert (COMPOSE.parent / source).exists(), f"{name}: {volume}"
                assert volume.endswith(":ro"), f"{name}: {volume}"
            else:
                assert source in document["volumes"], f"{name}: {volume}"
    # Every file a service reads is one the set-up writes into its --report folder.
    setup = found["setup"]["command"]
    folder = setup[setup.index("--report") + 1]
    written = {f"{folder}/{name}" for name in ("topology.json", "scenario.json", "actions.yaml")}
    for name in ("streams", "actions", "agent"):
        paths = {arg for arg in found[name]["command"] if arg.startswith("/")}
        assert paths and paths <= written, f"{name} reads {paths - written}"


def test_image_holds_every_package() -> None:
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text(encoding="utf-8")
    pyproject = (COMPOSE.parent / "pyproject.toml").read_text(encoding="utf-8")
    include = re.search(r"include = \[([^\]]*)\]", pyproject)
    assert include is not None
    packages = re.findall(r'"(\w+)\*"', include.group(1))
    for package in packages:
        assert f"COPY {package} {package}" in dockerfile, package


def test_the_monitoring_stack_scrapes_the_workers_with_c4s_rules_and_dashboard() -> None:
    found = services()
    scrape = yaml.safe_load((COMPOSE.parent / "deploy/compose/prometheus.yml").read_text())
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in scrape["scrape_configs"]
    }
    # The jobs c4-rules.yml names, at the ports and addresses the workers serve /metrics on.
    for job, service in (("c4-streams", "streams"), ("c4-actions", "actions")):
        command = found[service]["command"]
        port = command[command.index("--metrics-port") + 1]
        assert targets[job] == [f"{service}:{port}"]
        assert command[command.index("--metrics-address") + 1] == "0.0.0.0"  # noqa: S104
    assert scrape["rule_files"] == ["/etc/prometheus/rules/c4-rules.yml"]
    assert (
        "./deploy/prometheus/c4-rules.yml:/etc/prometheus/rules/c4-rules.yml:ro"
        in (found["prometheus"]["volumes"])
    )
    assert scrape["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "alertmanager:9093"
    ]
    grafana = found["grafana"]["volumes"]
    assert any(v.startswith("./deploy/grafana/c4-dashboard.json:") for v in grafana)
    for name in ("prometheus", "alertmanager", "grafana"):
        assert all(port.startswith("127.0.0.1:") for port in found[name]["ports"])


def test_the_env_example_lists_every_variable_the_compose_file_reads() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    example = (COMPOSE.parent / ".env.example").read_text(encoding="utf-8")
    listed = set(re.findall(r"^([A-Z0-9_]+)=", example, re.MULTILINE))
    assert used == listed

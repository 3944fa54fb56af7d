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
        assert name in {"kafka", "redis"}
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
    for name, service in found.items():
        for needed in service.get("depends_on", {}):
            assert needed in found, f"{name} depends on unknown service {needed}"
        for volume in service.get("volumes", ()):
            assert volume.split(":")[0] in document["volumes"], f"{name}: {volume}"
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

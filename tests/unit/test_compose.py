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

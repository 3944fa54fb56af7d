"""The local Alertmanager's configuration, command line and folder (no process started)."""

from __future__ import annotations

from pathlib import Path

import yaml

from c4.settings import Settings
from c4.stack.alertmanager import (
    alertmanager_argv,
    alertmanager_component,
    alertmanager_status,
    alertmanager_url,
    config_path,
    render_alertmanager_config,
)


def settings(tmp_path: Path) -> Settings:
    return Settings(stack_dir=tmp_path / "stack", stack_alertmanager_port=19555)


def test_the_default_port_is_not_kafkas_controller() -> None:
    defaults = Settings()
    assert defaults.stack_alertmanager_port != defaults.stack_controller_port


def test_a_configuration_routes_every_alert_to_the_webhooks_with_resolutions() -> None:
    config = yaml.safe_load(
        render_alertmanager_config(
            ["http://127.0.0.1:5001/a", "http://127.0.0.1:5002/b"],
            group_by=["diagnosis"],
            group_wait_s=0,
            group_interval_s=1.5,
            repeat_interval_s=3600,
        )
    )
    assert config["route"] == {
        "receiver": "c4-webhooks",
        "group_by": ["diagnosis"],
        "group_wait": "0s",
        "group_interval": "1500ms",
        "repeat_interval": "3600s",
    }
    assert config["receivers"] == [
        {
            "name": "c4-webhooks",
            "webhook_configs": [
                {"url": "http://127.0.0.1:5001/a", "send_resolved": True},
                {"url": "http://127.0.0.1:5002/b", "send_resolved": True},
            ],
        }
    ]


def test_without_webhooks_alerts_go_to_nobody() -> None:
    config = yaml.safe_load(render_alertmanager_config())
    assert config["route"]["receiver"] == "c4-nobody"
    assert config["route"]["group_by"] == ["alertname", "training_job", "node"]
    assert config["receivers"] == [{"name": "c4-nobody"}]


def test_it_listens_on_loopback_alone_with_everything_in_its_folder(tmp_path: Path) -> None:
    made = settings(tmp_path)
    folder = tmp_path / "stack" / "run" / "alertmanager-19555"
    assert alertmanager_component(made).run_dir == folder
    assert config_path(made) == folder / "alertmanager.yml"
    assert alertmanager_url(made) == "http://127.0.0.1:19555"
    assert alertmanager_argv(made, "/usr/bin/prometheus-alertmanager") == [
        "/usr/bin/prometheus-alertmanager",
        f"--config.file={folder}/alertmanager.yml",
        f"--storage.path={folder}/data",
        "--web.listen-address=127.0.0.1:19555",
        "--web.external-url=http://127.0.0.1:19555",
        "--cluster.listen-address=",
        "--log.level=info",
    ]
    assert alertmanager_status(made).state == "stopped"

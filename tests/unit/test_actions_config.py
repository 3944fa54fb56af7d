"""The worker's configuration file: defaults, validation errors in one line, secrets from env."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from actions.config import ConfigError, load_config, parse_config
from actions.worker import EXECUTORS
from schemas.messages import DiagnosisClass


def test_defaults_are_valid_and_name_only_known_actions() -> None:
    config = load_config(None, {})
    config.check_actions(executor.name for executor in EXECUTORS)
    assert config.policy.classes["noncomm_hang"] == ("isolate", "restart", "alert")
    assert config.policy.blast_radius == 4


def test_every_diagnosis_class_has_a_default_action() -> None:
    # A class added to the contract without a default gets no action at all: a miscabled
    # port, for one, would be seen only on the dashboard.
    classes = set(get_args(DiagnosisClass))
    assert classes == set(load_config(None, {}).policy.classes)
    assert load_config(None, {}).policy.classes["miscabled"] == ("alert",)


def test_yaml_file_with_receivers_and_secrets(tmp_path: Path) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text(
        "policy:\n  min_score: 0.8\n  classes:\n    node_down: [isolate, alert]\n"
        "receivers:\n  - name: oncall\n    url: https://alerts.example/hook\n"
        "    secret_env: HOOK_KEY\n    classes: [node_down]\n"
        "launcher:\n  command: [/usr/bin/launch, --job, '{job}']\n"
    )
    config = load_config(path, {"HOOK_KEY": "k1"})
    assert config.policy.min_score == 0.8
    [receiver] = config.receivers
    assert receiver.secret is not None
    assert receiver.secret.get_secret_value() == "k1"
    assert "k1" not in repr(config)
    assert config.launcher.command == ("/usr/bin/launch", "--job", "{job}")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"policy": {"min_score": 2}}, "policy.min_score: Input should be less than or equal to 1"),
        (
            {"policy": {"classes": {"oops": ["alert"]}}},
            "policy.classes.oops.[key]: Input should be",
        ),
        ({"receivers": [{"name": "a", "url": "ftp://x"}]}, "receivers.0.url: String should match"),
        (
            {"receivers": [{"name": "a", "url": "http://x", "jobs": ["("]}]},
            "bad regular expression",
        ),
        ({"receivers": [{"name": "a", "url": "http://x/"}] * 2}, "receiver name 'a' is used twice"),
        ({"retries": 3}, "retries: Extra inputs are not permitted"),
        ({"reroute": {"hash": "md5"}}, "reroute.hash: unknown hash model 'md5' (known: crc32"),
        ({"reroute": {"mode": "all"}}, "reroute.mode: Input should be 'incremental' or 'best'"),
        (
            {"receivers": [{"name": "a", "url": "http://x/", "secret_env": "NOPE"}]},
            "receivers[0].secret_env: environment variable NOPE is not set",
        ),
    ],
)
def test_invalid_configurations_fail_in_one_line(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, {})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unknown_action_in_the_class_map_is_named() -> None:
    config = parse_config({"policy": {"classes": {"node_down": ["isolate", "reboot"]}}}, {})
    with pytest.raises(
        ConfigError,
        match=r"node_down: unknown action 'reboot' \(known: alert, isolate, reroute, restart\)",
    ):
        config.check_actions(executor.name for executor in EXECUTORS)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML: ") as caught:
        load_config(bad, {})
    assert "\n" not in str(caught.value)
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load_config(listed, {})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json", {})

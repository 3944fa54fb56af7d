"""One deployment setting, ``C4_DEPLOYMENT``, from which every name a deployment owns derives."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from c4.cli import build_parser, main
from c4.deployment import DeploymentNames
from c4.settings import Settings, load_settings
from c4.streams_cmd import options_of
from c4.streams_wiring import StreamsOptions, StreamsOptionsError, build_streams_worker
from schemas.topics import ALL_TOPICS, TopicNames

SETTINGS_ENV = [f"C4_{name.upper()}" for name in Settings.model_fields]
deployments = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,47}", fullmatch=True).filter(
    lambda deployment: deployment != "c4"
)


@pytest.fixture(autouse=True)
def _no_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings of the test alone, not of the shell that runs it."""
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)


def owned_names(names: DeploymentNames) -> set[str]:
    """Every topic and consumer group name of a deployment (changelogs included)."""
    app_id = names.streams_app_id
    topics = {TopicNames(names.topic_prefix).of(topic) for topic in ALL_TOPICS}
    changelogs = {f"{app_id}-{table}-changelog" for table in ("job-state", "node-state")}
    return topics | changelogs | {app_id, names.actions_group, names.dashboard_group()}


def test_the_empty_deployment_keeps_todays_names(tmp_path: Path) -> None:
    names = DeploymentNames("")
    assert names.topic_prefix == ""
    assert names.redis_key_prefix == "c4"
    assert names.streams_app_id == "c4-streams"
    assert names.actions_group == "c4-actions"
    assert names.dashboard_group().startswith("c4-dashboard-")
    assert names.data_dir(tmp_path) == tmp_path
    settings = Settings(stack_dir=tmp_path)
    assert (settings.topic_prefix, settings.redis_key_prefix) == ("", "c4")
    assert settings.deployment_dir == tmp_path


def test_a_deployment_owns_its_names(tmp_path: Path) -> None:
    names = DeploymentNames("staging")
    assert names.topic_prefix == "staging."
    assert names.redis_key_prefix == "staging.c4"
    assert names.streams_app_id == "staging.c4-streams"
    assert names.actions_group == "staging.c4-actions"
    assert names.dashboard_group().startswith("staging.c4-dashboard-")
    assert names.dashboard_group() != names.dashboard_group()  # each dashboard reads it all
    assert names.data_dir(tmp_path) == tmp_path / "deployments" / "staging"


def test_the_prefixes_derive_from_the_deployment_unless_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("C4_DEPLOYMENT", "prod")
    monkeypatch.setenv("C4_STACK_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.topic_prefix == "prod."
    assert settings.redis_key_prefix == "prod.c4"
    assert settings.names.streams_app_id == "prod.c4-streams"
    assert settings.deployment_dir == tmp_path / "deployments" / "prod"
    # Set, even empty, a prefix wins: a deployment can keep the topics it has.
    monkeypatch.setenv("C4_TOPIC_PREFIX", "")
    monkeypatch.setenv("C4_REDIS_KEY_PREFIX", "{prod}")
    settings = load_settings()
    assert (settings.topic_prefix, settings.redis_key_prefix) == ("", "{prod}")
    assert Settings(deployment="prod", topic_prefix="x.").topic_prefix == "x."


@pytest.mark.parametrize(
    "deployment", ["a.b", "-a", "_a", "a/b", "..", "a b", "a:b", "é", "x" * 49, "c4"]
)
def test_unusable_deployments_are_refused(deployment: str) -> None:
    with pytest.raises(ValidationError, match="deployment"):
        Settings(deployment=deployment)


def test_a_bad_deployment_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("C4_DEPLOYMENT", "prod/../x")
    assert main(["topics", "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("c4: error: setting deployment:")


@given(deployments, deployments)
def test_two_deployments_share_no_name(first: str, second: str) -> None:
    assume(first != second)
    ours, theirs, plain = DeploymentNames(first), DeploymentNames(second), DeploymentNames("")
    assert not owned_names(ours) & owned_names(theirs)
    assert not owned_names(ours) & owned_names(plain)
    # No name of another starts with ours: cleaning up "<deployment>." spares the others.
    assert not [n for n in owned_names(theirs) | owned_names(plain) if n.startswith(f"{first}.")]
    keys = [f"{names.redis_key_prefix}:" for names in (ours, theirs, plain)]
    assert not [(a, b) for a in keys for b in keys if a != b and b.startswith(a)]


def _streams_args(*argv: str) -> argparse.Namespace:
    return build_parser(["streams"]).parse_args(["streams", "worker", *argv])


def test_streams_worker_options_read_the_environment_and_options_win() -> None:
    environ = {
        "C4_STREAMS_APP_ID": "from-env",
        "C4_STREAMS_SESSION_TIMEOUT": "6",
        "C4_STREAMS_SNAPSHOT_INTERVAL": "0.5",
        "C4_STREAMS_METRICS_PORT": "0",
        "C4_STREAMS_TOPOLOGY": "topology.json",
    }
    options = options_of(_streams_args(), environ)
    assert options.app_id == "from-env"
    assert options.session_timeout_s == 6
    assert options.snapshot_interval_s == 0.5
    assert options.metrics_port == 0
    assert options.topology == "topology.json"
    assert options.web_port == 6066
    given_options = options_of(
        _streams_args("--app-id", "given", "--session-timeout", "30", "--metrics-port", "9999"),
        environ,
    )
    assert given_options.app_id == "given"
    assert given_options.session_timeout_s == 30
    assert given_options.metrics_port == 9999
    assert given_options.snapshot_interval_s == 0.5
    # Nothing set: the app id is the deployment's, chosen when the worker is built.
    assert options_of(_streams_args(), {}) == StreamsOptions(web_port=6066)
    assert not given_options.split
    assert options_of(_streams_args("--split"), {}).split
    assert options_of(_streams_args(), {"C4_STREAMS_SPLIT": "1"}).split
    with pytest.raises(StreamsOptionsError, match="C4_STREAMS_SPLIT"):
        options_of(_streams_args(), {"C4_STREAMS_SPLIT": "2"})


def test_streams_worker_refuses_a_bad_variable_with_exit_2() -> None:
    with pytest.raises(StreamsOptionsError, match="C4_STREAMS_CLOCK_RATE") as raised:
        options_of(_streams_args(), {"C4_STREAMS_CLOCK_RATE": "fast"})
    assert raised.value.exit_code == 2


def test_streams_worker_app_and_files_are_the_deployments(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No broker in the unit tier: the access check is the integration tier's.
    monkeypatch.setattr("c4.security.check_kafka_access", lambda *args, **kwargs: None)
    settings = Settings(deployment="staging", stack_dir=tmp_path)
    app = build_streams_worker(settings, StreamsOptions()).app
    assert app.conf.id == "staging.c4-streams"
    assert Path(app.conf.datadir) == tmp_path / "deployments/staging/faust/staging.c4-streams"
    changelog = app.tables["job-state"].changelog_topic.get_topic_name()
    assert changelog == "staging.c4-streams-job-state-changelog"
    explicit = build_streams_worker(settings, StreamsOptions(app_id="mine")).app
    assert explicit.conf.id == "mine"
    assert Path(explicit.conf.datadir) == tmp_path / "deployments/staging/faust/mine"

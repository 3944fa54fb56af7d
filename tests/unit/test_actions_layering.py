"""The pure parts of the action workers import no Kafka or Redis client; the pipeline's
stages reach the cluster state through its Protocols; every module is small and says its job."""

from __future__ import annotations

import ast

import pytest

from tests.unit.test_layering import REPO, TRANSPORTS, imported_roots, modules_imported_by

PURE = [
    "outcome",
    "config",
    "policy",
    "alertmanager",
    "alertmanager_v2",
    "webhook",
    "launcher",
    "recording",
    "state/model",
    "state/protocols",
]
# Kafka only in the transport (and the worker loop that holds it); Redis only in actions/state.
STAGES = ["pipeline", "stages", "step_stages"]
NO_KAFKA = [*PURE, *STAGES, "executors", "alertmanager_client", "reroute_executor", "metrics"]
NO_REDIS = [*NO_KAFKA, "transport", "worker"]
# What the stages and the executors may import of the cluster state: its values, its
# Protocols and its errors, never a store.
STATE_INTERFACE = {"actions.state", "actions.state.model", "actions.state.protocols"}


def imported_modules(module: str) -> set[str]:
    return modules_imported_by(REPO / "actions" / f"{module}.py")


@pytest.mark.parametrize("module", PURE)
def test_pure_action_modules_import_no_transport(module: str) -> None:
    path = REPO / "actions" / f"{module}.py"
    assert not imported_roots(path) & TRANSPORTS, path


@pytest.mark.parametrize("module", NO_KAFKA)
def test_kafka_is_reached_through_the_transport_module_only(module: str) -> None:
    assert "confluent_kafka" not in imported_roots(REPO / "actions" / f"{module}.py")


@pytest.mark.parametrize("module", NO_REDIS)
def test_redis_is_reached_through_the_state_package_only(module: str) -> None:
    assert "redis" not in imported_roots(REPO / "actions" / f"{module}.py")


@pytest.mark.parametrize(
    "module", [*STAGES, "executors", "alertmanager_client", "reroute_executor"]
)
def test_stages_and_executors_see_the_state_through_its_protocols(module: str) -> None:
    state = {name for name in imported_modules(module) if name.startswith("actions.state")}
    assert state <= STATE_INTERFACE, sorted(state - STATE_INTERFACE)


@pytest.mark.parametrize("module", STAGES)
def test_the_pipeline_depends_on_no_executor_internals(module: str) -> None:
    imported = imported_modules(module)
    assert not imported & {
        "actions.alertmanager",
        "actions.alertmanager_v2",
        "actions.alertmanager_client",
        "actions.reroute_executor",
    }


def test_every_actions_module_is_small_and_says_its_job() -> None:
    for path in sorted((REPO / "actions").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 500, f"{path.relative_to(REPO)} is over 500 lines"
        assert ast.get_docstring(ast.parse(source)), f"{path.relative_to(REPO)} has no docstring"

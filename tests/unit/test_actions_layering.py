"""The pure parts of the action workers import no Kafka or Redis client."""

from __future__ import annotations

import pytest

from tests.unit.test_layering import REPO, TRANSPORTS, imported_roots

PURE = ["outcome", "config", "policy", "alertmanager", "webhook", "launcher"]
# Kafka only in the transport (and the worker loop that holds it); Redis only in actions/state.
NO_KAFKA = [*PURE, "executors", "reroute_executor", "pipeline", "metrics"]
NO_REDIS = [*NO_KAFKA, "transport", "worker"]


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

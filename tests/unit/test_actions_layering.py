"""The action workers in layers, as Alertmanager's notify/: the shared modules (config, webhook,
launcher, metrics, transport, the cluster state) <- the pipeline (stages, policy, outcome,
recording, the Executor interface) <- the drivers <- the worker, never an arrow up. The pure
parts import no Kafka or Redis client; the stages and the executors reach the cluster state
through its Protocols; every module is small and says its job."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_layering import REPO, TRANSPORTS, imported_roots, modules_imported_by

ACTIONS = REPO / "actions"
PURE = [
    "pipeline/outcome",
    "config",
    "pipeline/policy",
    "pipeline/executor",
    "drivers/alertmanager/payload",
    "drivers/alertmanager/v2",
    "webhook",
    "launcher",
    "pipeline/recording",
    "state/model",
    "state/protocols",
]
# Kafka only in the transport (and the worker loop that holds it); Redis only in actions/state.
STAGES = ["pipeline/pipeline", "pipeline/stages", "pipeline/step_stages"]
EXECUTORS = [
    "drivers/state/executors",
    "drivers/alertmanager/executor",
    "drivers/alertmanager/client",
    "drivers/reroute/executor",
]
NO_KAFKA = [*PURE, *STAGES, *EXECUTORS, "metrics"]
NO_REDIS = [*NO_KAFKA, "transport", "worker"]
# What the stages and the executors may import of the cluster state: its values, its
# Protocols and its errors, never a store.
STATE_INTERFACE = {"actions.state", "actions.state.model", "actions.state.protocols"}
# The layers inside actions/, bottom up: each may import only the ones before it.
PIPELINE = "actions.pipeline"
DRIVERS = "actions.drivers"
WORKER = "actions.worker"
# What every scheduler driver shares: the isolate of the cluster state, run first, and the
# steps both drivers take.
SHARED_DRIVERS = {"state", "scheduler_steps"}


def imported_modules(module: str) -> set[str]:
    return modules_imported_by(ACTIONS / f"{module}.py")


def dotted(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def actions_modules_under(folder: Path) -> list[Path]:
    files = sorted(folder.rglob("*.py"))
    assert files, folder
    return files


def reaches(path: Path, layers: tuple[str, ...]) -> set[str]:
    return {
        module
        for module in modules_imported_by(path)
        if any(module == layer or module.startswith(layer + ".") for layer in layers)
    }


@pytest.mark.parametrize("module", PURE)
def test_pure_action_modules_import_no_transport(module: str) -> None:
    path = ACTIONS / f"{module}.py"
    assert not imported_roots(path) & TRANSPORTS, path


@pytest.mark.parametrize("module", NO_KAFKA)
def test_kafka_is_reached_through_the_transport_module_only(module: str) -> None:
    assert "confluent_kafka" not in imported_roots(ACTIONS / f"{module}.py")


@pytest.mark.parametrize("module", NO_REDIS)
def test_redis_is_reached_through_the_state_package_only(module: str) -> None:
    assert "redis" not in imported_roots(ACTIONS / f"{module}.py")


@pytest.mark.parametrize("module", [*STAGES, *EXECUTORS])
def test_stages_and_executors_see_the_state_through_its_protocols(module: str) -> None:
    state = {name for name in imported_modules(module) if name.startswith("actions.state")}
    assert state <= STATE_INTERFACE, sorted(state - STATE_INTERFACE)


def test_the_pipeline_imports_nothing_of_the_drivers_or_the_worker() -> None:
    for path in actions_modules_under(ACTIONS / "pipeline"):
        above = reaches(path, (DRIVERS, WORKER))
        assert not above, f"{path.relative_to(REPO)} imports {sorted(above)}"


def test_the_shared_modules_import_nothing_of_the_layers_above() -> None:
    shared = [p for p in actions_modules_under(ACTIONS) if dotted(p).count(".") < 2]
    shared += actions_modules_under(ACTIONS / "state")
    for path in shared:
        if dotted(path) == WORKER:
            continue
        above = reaches(path, (PIPELINE, DRIVERS, WORKER))
        assert not above, f"{path.relative_to(REPO)} imports {sorted(above)}"


def test_the_drivers_import_no_worker_and_no_other_system_s_driver() -> None:
    for path in actions_modules_under(ACTIONS / "drivers"):
        own = path.relative_to(ACTIONS / "drivers").with_suffix("").parts[0]
        assert not reaches(path, (WORKER,)), path.relative_to(REPO)
        for module in reaches(path, (DRIVERS,)):
            system = module.split(".")[2]
            allowed = {own, *SHARED_DRIVERS}
            assert system in allowed, f"{path.relative_to(REPO)} imports {module}"


def test_every_actions_module_is_small_and_says_its_job() -> None:
    for path in actions_modules_under(ACTIONS):
        source = path.read_text(encoding="utf-8")
        assert len(source.splitlines()) <= 500, f"{path.relative_to(REPO)} is over 500 lines"
        assert ast.get_docstring(ast.parse(source)), f"{path.relative_to(REPO)} has no docstring"

"""The pure cores import no transport: detection and planning never see Kafka, Faust or Redis;
and no layer imports one above it: schemas <- topology <- producers / streams / planner / actions
<- c4."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRANSPORTS = {"faust", "mode", "confluent_kafka", "aiokafka", "redis"}
PURE = ["streams/core", "planner", "topology", "schemas", "simulator"]


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", PURE)
def test_pure_package_imports_no_transport(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    for path in files:
        assert not imported_roots(path) & TRANSPORTS, path


def test_topology_imports_nothing_of_the_layers_above() -> None:
    for path in sorted((REPO / "topology").rglob("*.py")):
        above = {"simulator", "producers", "streams", "planner", "actions", "c4"}
        assert not imported_roots(path) & above, path


# Each layer and what it may import of the project: only what is below it. The command
# line (c4) sits on top and wires the others; `faust -A c4.faust_app` is an entry point of
# that top layer, so no layer below needs to import upward to be started.
LAYERS: dict[str, set[str]] = {
    "schemas": set(),
    "topology": {"schemas"},
    "simulator": {"schemas", "topology"},
    "producers": {"schemas", "topology"},
    "streams": {"schemas", "topology"},
    # C4P beside the streams workers: pure, it sees only the fabric and the v1 messages.
    "planner": {"schemas", "topology"},
    # The reroute action asks the planner for its routes.
    "actions": {"schemas", "topology", "planner"},
}
PROJECT = {*LAYERS, "c4"}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_no_layer_imports_a_layer_above_it(layer: str) -> None:
    for path in sorted((REPO / layer).rglob("*.py")):
        above = (imported_roots(path) & PROJECT) - LAYERS[layer] - {layer}
        assert not above, f"{path.relative_to(REPO)} imports {sorted(above)}"


def modules_imported_by(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_product_never_imports_the_planners_evaluation_models() -> None:
    """`planner.eval` measures C4P for the benchmarks and tests; nothing that ships runs it."""
    for layer in sorted(PROJECT):
        for path in sorted((REPO / layer).rglob("*.py")):
            if path.is_relative_to(REPO / "planner" / "eval"):
                continue
            models = {m for m in modules_imported_by(path) if m.startswith("planner.eval")}
            assert not models, f"{path.relative_to(REPO)} imports {sorted(models)}"


def test_inside_c4_no_module_imports_a_command_and_the_dashboard_nothing_of_the_demo() -> None:
    """A ``*_cmd`` module is a command's entry (only c4.cli imports it): what commands share
    lives in a module of its own. The demo embeds the dashboard, never the other way."""
    for path in sorted((REPO / "c4").rglob("*.py")):
        here = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for module in modules_imported_by(path):
            if not module.startswith("c4.") or here == "c4.cli":
                continue
            assert not module.endswith("_cmd"), f"{here} imports the command {module}"
            if here.startswith("c4.dashboard"):
                assert not module.startswith("c4.demo"), f"{here} imports {module}"

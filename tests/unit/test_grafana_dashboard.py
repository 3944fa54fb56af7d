"""The Grafana dashboard: its JSON is what the code builds, and its queries are sound."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from actions.metrics import ActionMetrics
from streams.metrics import StreamMetrics

BUILDER = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "build_dashboard.py"


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_committed_json_is_what_the_code_builds() -> None:
    board = builder()
    assert board.main(["--check"]) == 0, "run python deploy/grafana/build_dashboard.py"
    model = json.loads(board.OUTPUT.read_text(encoding="utf-8"))
    assert model["uid"] == "c4-overview"
    titles = [panel["title"] for panel in model["panels"]]
    for wanted in ("Open findings by class", "Detection latency", "Operations per job"):
        assert wanted in titles
    assert any("link utilisation" in title for title in titles)
    # Every panel reads the data source the variable picks.
    assert {p["datasource"]["uid"] for p in model["panels"]} == {"${datasource}"}
    (variable,) = model["templating"]["list"]
    assert (variable["name"], variable["type"]) == ("datasource", "datasource")


def test_a_stale_json_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = builder()
    stale = tmp_path / "c4-dashboard.json"
    stale.write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(board, "OUTPUT", stale)
    assert board.main(["--check"]) == 1


def test_every_query_names_metrics_the_workers_serve() -> None:
    served = set()
    for registry in (StreamMetrics().registry, ActionMetrics().registry):
        for family in registry.collect():
            served.add(family.name)
            served.update(sample.name for sample in family.samples)
    for expr in builder().queries():
        for name in re.findall(r"\b(c4_[a-z_]+)", expr):
            base = re.sub(r"_(bucket|total|count|sum)$", "", name)
            assert name in served or base in served, f"{name} in {expr!r}"

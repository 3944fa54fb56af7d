"""The scenario suite on a reduced size: every target of the full suite must hold here too."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from scenario_suite import missed_targets, run_suite  # noqa: E402


def test_reduced_suite_meets_every_target() -> None:
    summary = run_suite(cases=36, seed=3, sizes=(8, 64))
    assert summary.cases == 36
    assert summary.healthy_runs >= 5
    assert set(summary.faults) == {
        "slow_gpu",
        "gpu_stop",
        "process_stuck",
        "node_down",
        "port_degraded",
        "link_down",
        "fabric_link_degraded",
        "fabric_link_down",
    }
    assert missed_targets(summary) == []

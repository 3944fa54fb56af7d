"""The 3D-parallel suite on a reduced size: every fault kind and trap, every target."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from scenario_suite_3d import run_3d_suite  # noqa: E402

from simulator.suite3d import FAULT_KINDS, TRAPS


def test_reduced_3d_suite_meets_every_target() -> None:
    # Two of every fault kind after one of every trap (a quarter of the cases are healthy).
    summary = run_3d_suite(cases=24, seed=5, max_nodes=4, workers=1)
    assert set(summary.kinds) == set(FAULT_KINDS)
    assert set(summary.traps) == set(TRAPS)
    assert summary.problems() == []

"""Cases of the small scenario suite the unit tests share: one per fault kind."""

from __future__ import annotations

from functools import cache

from simulator.scenario import Scenario
from simulator.suite import generate_suite


@cache
def _cases() -> tuple[Scenario, ...]:
    return tuple(generate_suite(40, seed=11, sizes=(8, 64)))  # frozen models: shared safely


def suite_case(kind: str | None) -> Scenario:
    """The first case of the suite whose fault is of this kind (None: a healthy case)."""
    if kind is None:
        return next(c for c in _cases() if not c.faults)
    return next(c for c in _cases() if c.faults and c.faults[0].type == kind)

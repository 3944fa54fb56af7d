"""C4P, the traffic planner (pure: no Kafka, Faust or Redis): a path per flow that beats ECMP.

`plan` and `replan` take a `topology.model.Fabric` and v1 flows and return the v1 plan;
`lower_bound` says how good any plan can be; `replan_choice` trades extra moves for a lower
``max_util`` after a failure when asked to; `reroute` turns jobs and a diagnosis into v1 route
messages. `planner.eval` holds the models that measure it (benchmarks and tests only).
"""

from planner.choice import REPLAN_MODES, ReplanMode, Replanned, replan_choice
from planner.core import (
    RoutedPath,
    lower_bound,
    moved_flows,
    plan,
    plan_json,
    replan,
)


class PlannerError(Exception):
    """Root of every error raised by the planner."""


__all__ = [
    "PlannerError",
    "REPLAN_MODES",
    "ReplanMode",
    "Replanned",
    "RoutedPath",
    "lower_bound",
    "moved_flows",
    "plan",
    "plan_json",
    "replan",
    "replan_choice",
]

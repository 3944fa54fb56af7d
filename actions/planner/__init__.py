"""C4P, the traffic planner (pure: no Kafka, Faust or Redis): a path per flow that beats ECMP.

`plan` and `replan` take a `topology.model.Fabric` and v1 flows and return the v1 plan;
`lower_bound` says how good any plan can be; `evaluation` compares plans with ECMP under a
max-min fair bandwidth model.
"""

from actions.planner.core import (
    RoutedPath,
    lower_bound,
    moved_flows,
    plan,
    plan_json,
    replan,
)

__all__ = ["RoutedPath", "lower_bound", "moved_flows", "plan", "plan_json", "replan"]

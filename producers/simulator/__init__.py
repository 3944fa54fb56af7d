"""The cluster simulator: training jobs on a leaf-spine fabric, with injectable faults.

A producers source: it yields the v1 messages node agents and job launchers would send
(collective, link, gpu, job), in event time, plus the ground truth of the injected faults.
Pure: no Kafka here; publishing a run live is the publisher's job.
"""

from producers.simulator.run import simulate
from producers.simulator.scenario import Scenario, ScenarioError, parse_scenario, scenario_from
from producers.simulator.suite import generate_suite
from producers.simulator.truth import Truth, ground_truth

__all__ = [
    "Scenario",
    "ScenarioError",
    "Truth",
    "generate_suite",
    "ground_truth",
    "parse_scenario",
    "scenario_from",
    "simulate",
]

"""The cluster simulator: training jobs on a leaf-spine fabric, with injectable faults.

Not a producer: a stand-in for a whole cluster. It yields the v1 messages that node agents
and job launchers would send (collective, link, gpu, job), in event time, plus the ground
truth of the injected faults. Pure: no Kafka here; publishing a run live is the publisher's
job. It sits beside producers, above schemas and topology only.
"""

from simulator.errors import SimulatorError
from simulator.run import simulate
from simulator.scenario import Scenario, ScenarioError, parse_scenario, scenario_from
from simulator.suite import generate_suite
from simulator.truth import Truth, ground_truth

__all__ = [
    "Scenario",
    "ScenarioError",
    "SimulatorError",
    "Truth",
    "generate_suite",
    "ground_truth",
    "parse_scenario",
    "scenario_from",
    "simulate",
]

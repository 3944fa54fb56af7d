"""A scenario file read and its jobs placed on a topology, with one-line errors: for
`c4 simulate` and `c4 demo` alike."""

from __future__ import annotations

from c4 import C4Error
from c4.inputs import read_input
from schemas.files import Topology
from simulator import Scenario, ScenarioError, parse_scenario
from simulator.cluster import Cluster, build_cluster


class SimulateError(C4Error):
    """The scenario or topology of `c4 simulate` is unusable."""


def load_scenario(path: str, seed: int | None) -> Scenario:
    """The scenario file (``--seed`` replacing its seed), or a one-line error."""
    try:
        scenario = parse_scenario(read_input(path), path)
    except ScenarioError as error:
        raise SimulateError(str(error)) from error
    return scenario if seed is None else scenario.model_copy(update={"seed": seed})


def place(topology: Topology | None, scenario: Scenario, source: str) -> Cluster:
    """The scenario's jobs on the topology (or a generated one), or a one-line error."""
    try:
        return build_cluster(topology, scenario)
    except ScenarioError as error:
        message = f"{source}: {error}"
        raise SimulateError(message) from error

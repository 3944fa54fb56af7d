"""What ``c4 demo`` was asked for, and the inputs that follow from it: scenario and topology."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from c4.demo import DemoError
from c4.inputs import load_document, read_input
from schemas.files import Topology
from simulator import Scenario, ScenarioError, parse_scenario
from simulator.cluster import Cluster
from topology.generate import Shape, ShapeError, generate


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``c4 demo`` was asked for."""

    report: Path
    scenario: str | None = None  # None: the built-in three-job scenario
    topology: str | None = None  # None: generated (nodes x 8 GPUs x 8 dual-port NICs, 2 planes)
    nodes: int = 32
    spines: int = 4
    duration: float | None = None  # None: the scenario's own
    speed: float = 1.0
    settle_s: float = 25.0  # after the simulator: how long to wait for the last actions
    dashboard_port: int | None = 0  # None: no dashboard; 0: any free port
    keep_topics: bool = False
    # False: stop the simulator a few seconds after every fault was acted on. The simulator
    # replays a scripted run and does not follow reroutes: played on, it would keep the
    # rerouted connections slow and the detectors would rightly blame their new paths.
    full: bool = False
    setup_only: bool = False
    # A number: the chaos run (c4.demo.chaos) with this seed. The simulated nodes then hand
    # their records to a node agent process, and each process is killed once.
    chaos_seed: int | None = None
    chaos_first_s: tuple[float, float] = (6.0, 12.0)
    chaos_pause_s: tuple[float, float] = (2.0, 8.0)
    # True: the streams worker spreads each job's detection over its stages (``--split``)
    split: bool = False


def load_demo_scenario(path: str | None, duration: float | None) -> Scenario:
    """The scenario file (or the built-in one), with ``duration`` replacing its length."""
    if path is None:
        data = resources.files("c4.demo").joinpath("scenario.json").read_bytes()
        source = "built-in demo scenario"
    else:
        data = read_input(path)
        source = path
    try:
        scenario = parse_scenario(data, source)
    except ScenarioError as error:
        raise DemoError(str(error)) from None
    if duration is not None:
        scenario = scenario.model_copy(update={"duration_s": duration})
    return scenario


def demo_topology(options: DemoOptions) -> Topology:
    """The topology file given, or a generated one."""
    if options.topology is not None:
        return load_document(options.topology, "topology", Topology)
    try:
        return generate(Shape(nodes=options.nodes, spines=options.spines, nics=8, planes=2))
    except ShapeError as error:
        raise DemoError(str(error)) from None


def spare_nodes(cluster: Cluster) -> list[str]:
    """The nodes no job runs on: the spare pool."""
    busy = {node for job in cluster.jobs for node in job.nodes}
    return [node.id for node in cluster.topology.nodes if node.id not in busy]

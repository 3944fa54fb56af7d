"""A whole simulated run: jobs timed, then every node's reports merged in event-time order."""

from __future__ import annotations

from collections.abc import Iterator

from schemas.base import C4Model
from schemas.files import Topology
from schemas.messages import Job, RankPlace, Route, RoutePath
from simulator.agents import NodeAgent, build_agents
from simulator.cluster import GPUS_PER_NODE, Cluster, PlacedJob, build_cluster
from simulator.effects import job_effects
from simulator.jobsim import simulate_job
from simulator.pipeline import simulate_parallel_job
from simulator.scenario import Scenario


def simulate(topology: Topology | None, scenario: Scenario) -> Iterator[C4Model]:
    """Every v1 message of the run, sorted by ``ts_ns``; raises `ScenarioError` up front.

    Without a topology, one just big enough for the scenario is generated.
    """
    cluster = build_cluster(topology, scenario)
    return simulate_cluster(cluster, scenario)


def simulate_cluster(cluster: Cluster, scenario: Scenario) -> Iterator[C4Model]:
    """The messages of a run on an already placed cluster."""
    runs = [
        (simulate_parallel_job if job.spec.parallel is not None else simulate_job)(
            job, job_effects(cluster, scenario, job), scenario
        )
        for job in cluster.jobs
    ]
    agents = build_agents(cluster, scenario, runs)
    return _merged(cluster, scenario, agents)


def _merged(cluster: Cluster, scenario: Scenario, agents: list[NodeAgent]) -> Iterator[C4Model]:
    for job in cluster.jobs:
        yield job_message(job, scenario.start_ns)
    if scenario.emit_routes:
        yield from route_messages(cluster, scenario.start_ns)
    # Agents report at start + phase + k * interval with 0 <= phase < interval: report k of
    # every agent, in phase order, comes before report k + 1 of any. No sort needed.
    last = max((agent.last_k for agent in agents), default=-1)
    for k in range(last + 1):
        for agent in agents:
            if k <= agent.last_k:
                yield from agent.report(k)


def job_message(job: PlacedJob, ts_ns: int) -> Job:
    """The job's placement and communicators, as its launcher publishes them."""
    ranks = tuple(
        RankPlace.model_construct(
            rank=rank,
            node=job.node_of(rank),
            gpu=rank % GPUS_PER_NODE,
            port=job.port_id(rank).partition("/")[2],
        )
        for rank in range(job.spec.ranks)
    )
    return Job.model_construct(
        v=1,
        kind="job",
        job=job.spec.id,
        ts_ns=ts_ns,
        state="running",
        ranks=ranks,
        comms={comm.id: comm.members for comm in job.comms},
    )


def route_messages(cluster: Cluster, ts_ns: int) -> Iterator[Route]:
    """Per node, the path of every ring connection leaving it: ``job/comm/rank->peer``."""
    paths: dict[str, list[RoutePath]] = {}
    for job in cluster.jobs:
        for comm in job.comms:
            for conn in comm.network():
                node, _, port = str(conn.src_port).partition("/")
                flow = f"{job.spec.id}/{comm.id}/{conn.src}->{conn.dst}"
                paths.setdefault(node, []).append(
                    RoutePath.model_construct(flow=flow, port=port, via=conn.via, sport=conn.sport)
                )
    for node, node_paths in sorted(paths.items()):
        yield Route.model_construct(
            v=1, kind="route", node=node, ts_ns=ts_ns, plan="p-sim", paths=tuple(node_paths)
        )

"""Training traffic matrices for the C4P benchmark: Megatron layouts on a multi-rail fabric.

A node holds one tensor-parallel group (tp = its GPUs, one NIC per GPU: rail ``g`` is GPU
``g``'s NIC ``mlx5_<g>``); tensor parallelism runs over NVLink, so it adds no network flow.
Ranks send from port ``:1`` of their NIC (plane a); port ``:2`` (plane b) is the failover.
A job's nodes are ``pp`` stages of ``dp`` nodes, in Megatron's rank order (node ``k`` of the
job is replica ``k % dp`` of stage ``k // dp``); jobs get random nodes, as in `traffic`.

Phases, each a set of connections (every connection ``qps`` flows, one per queue pair):
- ``dp``: per (stage, rail) ``channels`` rings over the stage's replicas (NCCL channels);
- ``pp-fwd`` / ``pp-bwd``: activations to the next stage, gradients back, per (replica, rail);
- ``a2a`` (moe only): every ordered pair of each expert-parallel group, ``ep`` replicas of a
  stage on one rail (so on different nodes).
Within a phase a port's connections share its line rate equally, and every flow asks for
its share: a phase loads every cable it uses to exactly 1.0, so what is left to lose is in
the fabric. Phases run one after another (see `evaluation.iteration_ratio`): every flow
carries its phase's name as the contract's ``phase``, so the planner plans each apart.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from planner.reroute import route_around_cables
from schemas.files import Flow, Flows
from topology import TopologyError
from topology.model import Fabric

Mix = Literal["dp", "3d", "moe"]
MIXES: tuple[Mix, ...] = ("dp", "3d", "moe")
Failure = Literal["none", "link", "port", "spine"]
FAILURES: tuple[Failure, ...] = ("none", "link", "port", "spine")
PHASES = ("dp", "pp-fwd", "pp-bwd", "a2a")
PIPELINE_STAGES = 4
EXPERT_PARALLEL = 4


@dataclass(frozen=True, slots=True)
class ModelSize:
    """A GPT-style model, for the bytes of each phase per iteration (bf16 values).

    The default is about 22B parameters (12 x layers x hidden^2), the C4 paper's model size.
    """

    params: float = 12 * 48 * 6144**2
    hidden: int = 6144
    layers: int = 48
    seq_len: int = 2048
    micro_batches: int = 16  # per replica per iteration (micro-batch size 1)
    moe_every: int = 2  # every second layer is a mixture-of-experts layer (moe mix)
    top_k: int = 2
    value_bytes: int = 2


GPT_22B = ModelSize()


@dataclass(frozen=True, slots=True)
class Layout:
    """A job's parallelism: tp GPUs of a node, pp stages, dp replicas, ep experts (1: none)."""

    tp: int
    pp: int
    dp: int
    ep: int = 1

    @property
    def nodes(self) -> int:
        """The nodes the layout occupies."""
        return self.pp * self.dp


@dataclass(frozen=True, slots=True)
class Phase:
    """One communication phase of a job: its flows (indices) and the bytes each carries."""

    name: str
    flows: tuple[int, ...]
    flow_bytes: float


@dataclass(frozen=True, slots=True)
class JobTraffic:
    """A job's layout, nodes in rank order, and phases (those with no flow left out)."""

    id: str
    layout: Layout
    nodes: tuple[str, ...]
    phases: tuple[Phase, ...]


@dataclass(frozen=True, slots=True)
class TrafficMatrix:
    """The flows of all jobs (v1 input; ``flows.down`` holds the failed links) and the jobs.

    After a failure, ``failure`` names what failed, ``failed_over`` the flows moved to their
    NICs' sibling ports and ``stranded`` (one line each) the flows left with no path.
    """

    mix: str
    flows: Flows
    jobs: tuple[JobTraffic, ...]
    failure: str = "none"
    failed_over: tuple[str, ...] = ()
    stranded: tuple[str, ...] = ()

    def phase_flows(self) -> dict[str, list[int]]:
        """Per phase name, the flows of every job in that phase (they run at the same time)."""
        out: dict[str, list[int]] = {}
        for job in self.jobs:
            for phase in job.phases:
                out.setdefault(phase.name, []).extend(phase.flows)
        return out


def layout_for(mix: Mix, nodes: int, gpus: int) -> Layout:
    """The layout of a mix on ``nodes`` nodes of ``gpus`` GPUs; raises `TopologyError`."""
    pp = 1 if mix == "dp" else PIPELINE_STAGES
    ep = EXPERT_PARALLEL if mix == "moe" else 1
    dp = nodes // pp
    dp -= dp % ep
    if dp < max(2, ep):
        error = f"a {mix} job needs at least {pp * max(2, ep)} nodes, got {nodes}"
        raise TopologyError(error)
    return Layout(tp=gpus, pp=pp, dp=dp, ep=ep)


def training_matrix(
    fabric: Fabric,
    mix: Mix,
    jobs: int,
    seed: int = 0,
    channels: int = 2,
    qps: int = 1,
    model: ModelSize = GPT_22B,
) -> TrafficMatrix:
    """``jobs`` jobs of one mix on a random split of the nodes (seeded, reproducible)."""
    if channels < 1 or qps < 1:
        error = f"channels and qps must be at least 1, got {channels} and {qps}"
        raise TopologyError(error)
    rails: dict[str, list[str]] = {}
    for port in fabric.ports.values():
        if port.id.endswith(":1"):
            rails.setdefault(port.node, []).append(port.id)
    names = sorted(rails)
    if not 1 <= jobs <= len(names) // 2:
        error = f"{jobs} jobs do not fit {len(names)} nodes at two or more nodes each"
        raise TopologyError(error)
    for node in names:  # rail g is mlx5_<g>: shorter names first puts mlx5_2 before mlx5_10
        rails[node].sort(key=lambda port: (len(port), port))
    rng = random.Random(seed)  # noqa: S311 - a reproducible placement, not a secret
    rng.shuffle(names)
    size = len(names) // jobs
    rows: list[dict[str, object]] = []
    result: list[JobTraffic] = []
    for j in range(jobs):
        members = names[j * size : (j + 1) * size]
        rail_count = len(rails[members[0]])
        shape = layout_for(mix, len(members), rail_count)
        builder = _JobBuilder(fabric, f"job-{j}", shape, members[: shape.nodes], rails, rows)
        phases = builder.build(channels, qps, model)
        result.append(JobTraffic(builder.job, shape, builder.nodes, phases))
    flows = Flows.model_validate({"v": 1, "kind": "flows", "flows": rows})
    return TrafficMatrix(mix, flows, tuple(result))


class _JobBuilder:
    """Appends one job's flow rows, phase by phase."""

    __slots__ = ("fabric", "job", "layout", "nodes", "rails", "rows")

    def __init__(
        self,
        fabric: Fabric,
        job: str,
        layout: Layout,
        nodes: Sequence[str],
        rails: dict[str, list[str]],
        rows: list[dict[str, object]],
    ) -> None:
        self.fabric, self.job, self.layout = fabric, job, layout
        self.nodes, self.rails, self.rows = tuple(nodes), rails, rows

    def node(self, stage: int, replica: int) -> str:
        return self.nodes[stage * self.layout.dp + replica]

    def connect(self, tag: str, src: str, dst: str, gbps_share: int, qps: int) -> None:
        """One connection as ``qps`` flows; ``gbps_share``: connections sharing each port."""
        a, b = self.fabric.ports[src], self.fabric.ports[dst]
        gbps = min(a.gbps, b.gbps) / gbps_share / qps
        phase = tag.partition("/")[0]  # tags start with their phase's name
        for q in range(qps):
            flow = f"{self.job}/{tag}" if qps == 1 else f"{self.job}/{tag}/q{q}"
            self.rows.append({"id": flow, "src": src, "dst": dst, "gbps": gbps, "phase": phase})

    def build(self, channels: int, qps: int, model: ModelSize) -> tuple[Phase, ...]:
        """Every phase's flows, appended to the rows; phases without flows left out."""
        phases = (
            self._data_parallel(channels, qps, model),
            *self._pipeline(qps, model),
            self._all_to_all(qps, model),
        )
        return tuple(phase for phase in phases if phase.flows)

    def _data_parallel(self, channels: int, qps: int, model: ModelSize) -> Phase:
        """A ring all-reduce of the stage's gradients (this GPU's 1/(tp pp) of them) per
        (stage, rail), over ``channels`` rings: every rank sends 2 (n-1)/n of them."""
        shape, start, n = self.layout, len(self.rows), self.layout.dp
        for stage in range(shape.pp):
            for g in self.rail_numbers():
                for c in range(channels):
                    for i in range(n):
                        k = (i + 1) % n
                        src, dst = self.port(stage, i, g), self.port(stage, k, g)
                        self.connect(f"dp/s{stage}/g{g}/c{c}/{i}->{k}", src, dst, channels, qps)
        grads = model.value_bytes * model.params / (shape.tp * shape.pp)
        return self.phase("dp", start, 2 * (n - 1) / n * grads / (channels * qps))

    def _pipeline(self, qps: int, model: ModelSize) -> tuple[Phase, Phase]:
        """Each micro-batch's activations to the next stage and their gradients back, per
        (replica, rail); with Megatron's scatter-gather a rank sends 1/tp of the tensor."""
        shape = self.layout
        tensor = model.value_bytes * model.seq_len * model.hidden / shape.tp
        phases = []
        for name, forward in (("pp-fwd", True), ("pp-bwd", False)):
            start = len(self.rows)
            for replica in range(shape.dp):
                for g in self.rail_numbers():
                    for s in range(shape.pp - 1):
                        a, b = (s, s + 1) if forward else (s + 1, s)
                        src, dst = self.port(a, replica, g), self.port(b, replica, g)
                        self.connect(f"{name}/d{replica}/g{g}/{a}->{b}", src, dst, 1, qps)
            phases.append(self.phase(name, start, tensor * model.micro_batches / qps))
        return phases[0], phases[1]

    def _all_to_all(self, qps: int, model: ModelSize) -> Phase:
        """Per MoE layer and micro-batch, each rank dispatches its tokens (sequence parallel:
        1/tp of them) to top-k experts and combines them back, forward and backward: four
        all-to-alls of its expert group, 1/ep of each to every peer."""
        shape, start, e = self.layout, len(self.rows), self.layout.ep
        groups = shape.dp // e if e > 1 else 0
        for stage in range(shape.pp):
            for group in range(groups):
                for g in self.rail_numbers():
                    ports = [self.port(stage, group * e + i, g) for i in range(e)]
                    for i, src in enumerate(ports):
                        for k, dst in enumerate(ports):
                            if i != k:
                                tag = f"a2a/s{stage}/e{group}/g{g}/{i}->{k}"
                                self.connect(tag, src, dst, e - 1, qps)
        moe_layers = model.layers // shape.pp // model.moe_every
        tokens = model.seq_len / shape.tp * model.top_k * model.hidden * model.value_bytes
        return self.phase("a2a", start, 4 * moe_layers * model.micro_batches * tokens / e / qps)

    def rail_numbers(self) -> range:
        return range(len(self.rails[self.nodes[0]]))

    def port(self, stage: int, replica: int, rail: int) -> str:
        return self.rails[self.node(stage, replica)][rail]

    def phase(self, name: str, start: int, flow_bytes: float) -> Phase:
        return Phase(name, tuple(range(start, len(self.rows))), flow_bytes)


def fail(fabric: Fabric, matrix: TrafficMatrix, failure: Failure, seed: int = 0) -> TrafficMatrix:
    """The matrix after one failure (``none``: unchanged), the failed element seeded.

    link: one fabric link a flow uses; port: the cable of a port flows start from, its flows
    failing over to the sibling port of the same NIC (`reroute.route_around_cables`, on
    the other plane); spine: every link of a spine flows use.
    """
    if failure == "none":
        return matrix
    rng = random.Random(seed)  # noqa: S311 - a reproducible choice, not a secret
    flows = matrix.flows.flows
    index = fabric.port_index
    crossing = [
        f for f in flows if fabric.port_leaf[index[f.src]] != fabric.port_leaf[index[f.dst]]
    ]
    chosen = rng.choice(crossing or list(flows))
    leaf = fabric.port_leaf[index[chosen.src]]
    spine = rng.choice(fabric.plane_spines[fabric.leaf_plane[leaf]])
    if failure == "port":
        name, down = f"port {chosen.src}", [chosen.src]
    elif failure == "link":
        link = fabric.link_ids[fabric.uplinks[leaf][spine]]
        name, down = f"link {link}", [link]
    else:
        down = [fabric.link_ids[x] for x, s in enumerate(fabric.link_spine) if s == spine]
        name = f"spine {fabric.spines[spine]}"
    return with_down(fabric, matrix, down, name)


def with_down(
    fabric: Fabric, matrix: TrafficMatrix, down: Iterable[str], name: str
) -> TrafficMatrix:
    """The matrix with these links down too: flows on a down cable fail over or strand."""
    links = {*matrix.flows.down, *down}
    routable, failed_over, stranded = route_around_cables(fabric, matrix.flows.flows, links)
    flows = Flows(v=1, kind="flows", flows=tuple(routable), down=tuple(sorted(links)))
    return TrafficMatrix(
        matrix.mix,
        flows,
        _renumber(matrix, routable),
        name,
        (*matrix.failed_over, *failed_over),
        (*matrix.stranded, *stranded),
    )


def _renumber(matrix: TrafficMatrix, kept: Sequence[Flow]) -> tuple[JobTraffic, ...]:
    """The jobs with phase flow indices into ``kept`` (stranded flows dropped)."""
    old = matrix.flows.flows
    if len(kept) == len(old):
        return matrix.jobs  # route_around_cables keeps order: the indices still hold
    position = {flow.id: i for i, flow in enumerate(kept)}
    jobs = []
    for job in matrix.jobs:
        phases = []
        for phase in job.phases:
            ids = (old[f].id for f in phase.flows)
            flows = tuple(position[flow] for flow in ids if flow in position)
            if flows:
                phases.append(replace(phase, flows=flows))
        jobs.append(replace(job, phases=tuple(phases)))
    return tuple(jobs)

"""The scenario file of ``c4 simulate``: jobs, checkpoint pauses and injected faults.

Validated with pydantic; any problem becomes one line naming the field (``faults[2].factor``).
Checks that need the topology (does the node exist, does the rank fit) live in `cluster`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simulator.errors import SimulatorError

DEFAULT_START_NS = 1_733_130_000_000_000_000
MIB = 1024 * 1024

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/~-]+$")]
Seconds = Annotated[float, Field(ge=0, le=86_400)]
DpOp = Literal["allreduce", "allgather", "reducescatter"]


class ScenarioError(SimulatorError):
    """A scenario (or its fit to the topology) is unusable; the message is one line."""


class _Strict(BaseModel):
    # Scenario files are written by hand: an unknown or misspelt key is an error, not ignored.
    model_config = ConfigDict(frozen=True, extra="forbid")


class Parallel(_Strict):
    """A Megatron-style 3D-parallel (and MoE) layout: ranks = tp x pp x dp.

    Global rank order is tp fastest, then dp, then pp (Megatron's default): a tensor-parallel
    group sits inside one node, pipeline stages are on different nodes, a data-parallel group
    spans the stage's replicas. ``ep`` > 1 splits each data-parallel group into expert-parallel
    groups of ``ep`` consecutive replicas that run all-to-alls around every MoE layer.
    """

    tp: int = Field(default=1, ge=1, le=8)
    pp: int = Field(default=1, ge=1, le=64)
    ep: int = Field(default=1, ge=1, le=256)
    microbatches: int = Field(default=8, ge=1, le=256)
    # Per microbatch and stage, the forward compute (backward takes twice as long).
    forward_ms: float = Field(default=8.0, gt=0, le=10_000)
    # Bytes of one pipeline activation, one tensor-parallel allreduce, one data-parallel
    # gradient bucket and one rank's all-to-all input.
    activation_bytes: int = Field(default=16 * MIB, ge=1, le=1 << 40)
    tp_bytes: int = Field(default=8 * MIB, ge=1, le=1 << 40)
    bucket_bytes: int = Field(default=64 * MIB, ge=1, le=1 << 40)
    dp_buckets: int = Field(default=4, ge=1, le=64)
    a2a_bytes: int = Field(default=4 * MIB, ge=1, le=1 << 40)
    # The busiest expert of an iteration gets this much more than its share of the tokens.
    hot_expert_load: float = Field(default=0.0, ge=0, le=4)
    # Persistent differences of GPU speed (uniform within +-spread): normal, not faults.
    gpu_spread: float = Field(default=0.02, ge=0, le=0.1)
    # Per rank and iteration, the chance that its data loader stalls it (first stage only).
    loader_stall: float = Field(default=0.0, ge=0, le=1)
    # Model chunks per stage (Megatron's virtual pipeline): above 1 the schedule is the
    # interleaved 1F1B, and the last stage sends on to the first over a wrap-around pair.
    virtual_stages: int = Field(default=1, ge=1, le=16)

    @model_validator(mode="after")
    def _check(self) -> Self:
        if 8 % self.tp:
            message = "parallel.tp must divide the node's 8 GPUs"
            raise ValueError(message)
        if self.pp > 1 and self.microbatches < self.pp:
            message = "parallel.microbatches must be at least pp (1F1B)"
            raise ValueError(message)
        if self.virtual_stages > 1 and (self.pp < 2 or self.microbatches % self.pp):
            message = "parallel.virtual_stages > 1 needs pp >= 2 and microbatches a multiple of pp"
            raise ValueError(message)
        return self


class Slowdown(_Strict):
    """A job-wide slowdown: every rank computes ``factor`` times longer (not a fault)."""

    job: Name
    at_s: Seconds
    until_s: Seconds
    factor: float = Field(gt=0, le=10)


class JobSpec(_Strict):
    """One training job: its size, placement, per-iteration work and communicators."""

    id: Name
    ranks: int = Field(ge=2, le=65_536)
    nodes: tuple[Name, ...] | None = None
    op_bytes: int = Field(default=64 * MIB, ge=1, le=1 << 40)
    tp_bytes: int | None = Field(default=None, ge=1, le=1 << 40)
    compute_ms: float = Field(default=200.0, gt=0, le=600_000)
    comms: tuple[Literal["dp", "tp"], ...] = ("dp",)
    dp_ops: tuple[DpOp, ...] = Field(default=("allreduce",), min_length=1, max_length=4)
    jitter: float = Field(default=0.01, ge=0, le=0.2)
    # A 3D-parallel job (tensor, pipeline, data and expert groups) instead of dp/tp rings.
    parallel: Parallel | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.parallel is not None:
            shape = self.parallel
            if self.ranks % (shape.tp * shape.pp):
                message = f"ranks {self.ranks} is not a multiple of tp x pp"
                raise ValueError(message)
            dp = self.ranks // (shape.tp * shape.pp)
            if dp % shape.ep:
                message = f"parallel.ep {shape.ep} must divide the data-parallel size {dp}"
                raise ValueError(message)
            if shape.pp > 1 and (shape.tp * dp) % 8:
                message = "a pipeline stage must fill whole nodes (tp x dp a multiple of 8)"
                raise ValueError(message)
        if "dp" not in self.comms:
            message = "comms must include 'dp' (the communicator over all ranks)"
            raise ValueError(message)
        if len(set(self.comms)) != len(self.comms):
            message = "comms lists a communicator twice"
            raise ValueError(message)
        return self


class Checkpoint(_Strict):
    """A job-wide pause: every rank stops issuing operations for ``pause_s``."""

    job: Name
    at_s: Seconds
    pause_s: float = Field(gt=0, le=3600)


class _Fault(_Strict):
    at_s: Seconds


class _Transient(_Fault):
    until_s: Seconds | None = None

    @model_validator(mode="after")
    def _check_until(self) -> Self:
        if self.until_s is not None and self.until_s <= self.at_s:
            message = f"until_s {self.until_s} must be after at_s {self.at_s}"
            raise ValueError(message)
        return self


class SlowGpu(_Transient):
    """One rank's compute takes ``factor`` times longer."""

    type: Literal["slow_gpu"]
    job: Name
    rank: int = Field(ge=0)
    factor: float = Field(gt=1, le=10)


class GpuStop(_Fault):
    """The GPU falls off the bus (XID 79): its rank never enters its next operation."""

    type: Literal["gpu_stop"]
    job: Name
    rank: int = Field(ge=0)


class ProcessStuck(_Fault):
    """The rank's process stays alive (heartbeats) and never enters its next operation."""

    type: Literal["process_stuck"]
    job: Name
    rank: int = Field(ge=0)


class NodeDown(_Fault):
    """The whole node goes silent: no collective, link or GPU message from it any more."""

    type: Literal["node_down"]
    node: Name


class PortDegraded(_Transient):
    """A NIC port runs at ``factor`` of its bandwidth with rising symbol errors."""

    type: Literal["port_degraded"]
    node: Name
    port: Name
    factor: float = Field(gt=0, lt=1)
    symbol_err_per_s: float | None = Field(default=None, ge=0, le=1e9)


class LinkDown(_Fault):
    """A NIC port's link goes down: traffic over it stalls, the ops needing it never finish."""

    type: Literal["link_down"]
    node: Name
    port: Name


class FabricLinkDegraded(_Transient):
    """A leaf~spine link runs at ``factor``: every connection crossing it slows."""

    type: Literal["fabric_link_degraded"]
    link: Name
    factor: float = Field(gt=0, lt=1)


class FabricLinkDown(_Fault):
    """A leaf~spine link goes dark: every connection crossing it crawls (see `effects`)."""

    type: Literal["fabric_link_down"]
    link: Name


Fault = Annotated[
    SlowGpu
    | GpuStop
    | ProcessStuck
    | NodeDown
    | PortDegraded
    | LinkDown
    | FabricLinkDegraded
    | FabricLinkDown,
    Field(discriminator="type"),
]
RankFault = SlowGpu | GpuStop | ProcessStuck
FAULT_TYPES: tuple[str, ...] = (
    "slow_gpu",
    "gpu_stop",
    "process_stuck",
    "node_down",
    "port_degraded",
    "link_down",
    "fabric_link_degraded",
    "fabric_link_down",
)


class PathChange(_Strict):
    """From ``at_s`` a ring connection takes another path (a reroute the fabric applied).

    ``flow`` is ``job/comm/src->dst`` as in the route plans; ``via`` the new spine (None:
    through one leaf); ``src_port``/``dst_port`` the ports when it failed over to others.
    """

    at_s: Seconds
    flow: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9._:/~>-]+$")]
    via: Name | None
    src_port: Name | None = None
    dst_port: Name | None = None


class FabricShape(_Strict):
    """The fabric generated when no topology is given."""

    nodes_per_leaf: int = Field(default=4, ge=1, le=4096)
    spines: int = Field(default=4, ge=1, le=1024)
    spare_nodes: int = Field(default=0, ge=0, le=65_536)


class Scenario(_Strict):
    """Everything one simulated run needs besides the topology."""

    name: Name | None = None
    seed: int = 0
    duration_s: float = Field(gt=0, le=86_400)
    interval_s: float = Field(default=1.0, ge=0.05, le=60)
    start_ns: int = Field(default=DEFAULT_START_NS, ge=0, le=(1 << 63) - 1)
    gpu_every_s: float = Field(default=5.0, gt=0, le=3600)
    # Probability per port per interval of one isolated symbol error (cables are not perfect).
    port_error_blips: float = Field(default=0.0, ge=0, le=1)
    # Nodes without a job or a fault send nothing unless asked (they only make the run big).
    report_idle_nodes: bool = False
    # Publish the ring connections' paths as c4.route.v1 plans, as a fabric under C4P would.
    emit_routes: bool = False
    fabric: FabricShape = FabricShape()
    jobs: tuple[JobSpec, ...] = Field(min_length=1, max_length=4096)
    checkpoints: tuple[Checkpoint, ...] = ()
    slowdowns: tuple[Slowdown, ...] = ()
    faults: tuple[Fault, ...] = ()
    # Reroutes applied while the run goes on (a live run adds those its route plans make).
    path_changes: tuple[PathChange, ...] = ()

    @model_validator(mode="after")
    def _check_names(self) -> Self:
        ids = [job.id for job in self.jobs]
        for index, job_id in enumerate(ids):
            if job_id in ids[:index]:
                message = f"jobs[{index}].id: {job_id!r} listed twice"
                raise ValueError(message)
        known = set(ids)
        named = (
            ("checkpoints", self.checkpoints),
            ("slowdowns", self.slowdowns),
            ("faults", self.faults),
        )
        for where, items in named:
            for index, item in enumerate(items):
                job = getattr(item, "job", None)
                if job is not None and job not in known:
                    message = f"{where}[{index}].job: unknown job {job!r}"
                    raise ValueError(message)
        ranks = {job.id: job.ranks for job in self.jobs}
        for index, fault in enumerate(self.faults):
            if isinstance(fault, RankFault) and fault.rank >= ranks[fault.job]:
                message = (
                    f"faults[{index}].rank: {fault.rank} >= {fault.job}'s {ranks[fault.job]} ranks"
                )
                raise ValueError(message)
        return self


def parse_scenario(data: bytes | str, source: str = "scenario") -> Scenario:
    """The scenario in a JSON document, or `ScenarioError` with one line naming the field."""
    try:
        document: Any = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        message = f"{source}: invalid JSON: {error}"
        raise ScenarioError(message) from error
    return scenario_from(document, source)


def scenario_from(document: Any, source: str = "scenario") -> Scenario:
    """Validate an already parsed scenario object; `ScenarioError` on the first problem."""
    if not isinstance(document, dict):
        message = f"{source}: expected a JSON object"
        raise ScenarioError(message)
    try:
        return Scenario.model_validate(document)
    except ValidationError as error:
        message = f"{source}: {_first_problem(error)}"
        raise ScenarioError(message) from error


def _first_problem(error: ValidationError) -> str:
    detail = error.errors(include_url=False)[0]
    where = ""
    for part in detail["loc"]:
        if isinstance(part, int):
            where += f"[{part}]"
        elif part in FAULT_TYPES:
            continue  # the union's branch name: the fault's own type says it
        else:
            where += f".{part}" if where else str(part)
    text = detail["msg"].removeprefix("Value error, ")
    more = error.error_count() - 1
    suffix = f" (and {more} more)" if more else ""
    return f"{where}: {text}{suffix}" if where else f"{text}{suffix}"

"""Models of the v1 message kinds that travel on Kafka topics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Self

from pydantic import Field, JsonValue, model_validator

from schemas.base import (
    MAX_ITEMS,
    C4Model,
    Id,
    Nanos,
    NonNegFloat,
    NonNegInt,
    PositiveInt,
    Score,
    Text,
    broken_rule,
)

OpName = Literal[
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "alltoall",
    "send",
    "recv",
    "barrier",
]
P2P_OPS: frozenset[str] = frozenset({"send", "recv"})
DiagnosisClass = Literal[
    "comm_hang",
    "noncomm_hang",
    "comm_slow",
    "noncomm_slow",
    "link_down",
    "link_degraded",
    "gpu_fault",
    "node_down",
    "ranks_missing",
    "miscabled",
]
SuspectType = Literal["rank", "node", "gpu", "port", "link", "switch"]
ActionName = Literal["isolate", "restart", "reroute", "alert", "release"]
ActionStatus = Literal["done", "skipped", "failed"]
Sport = NonNegInt


def _same_lengths(columns: dict[str, int]) -> str | None:
    """The first column whose length differs from the first one's, as a rule message."""
    names = list(columns)
    first = names[0]
    for name in names[1:]:
        if columns[name] != columns[first]:
            return f"{name}: {columns[name]} elements but {first} has {columns[first]}"
    return None


class Ops(C4Model):
    """Operations of one rank in one interval, columnar: element i of each array is one op."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {
            "x-c4-rules": [
                "all five arrays have the same length",
                "end_ns[i] is null or >= enter_ns[i]",
            ]
        }
    }

    seq: tuple[NonNegInt, ...] = Field(max_length=MAX_ITEMS)
    op: tuple[OpName, ...] = Field(max_length=MAX_ITEMS)
    bytes: tuple[NonNegInt, ...] = Field(max_length=MAX_ITEMS)
    enter_ns: tuple[Nanos, ...] = Field(max_length=MAX_ITEMS)
    end_ns: tuple[Nanos | None, ...] = Field(max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _check_columns(self) -> Self:
        mismatch = _same_lengths(
            {
                "seq": len(self.seq),
                "op": len(self.op),
                "bytes": len(self.bytes),
                "enter_ns": len(self.enter_ns),
                "end_ns": len(self.end_ns),
            }
        )
        if mismatch is not None:
            path, _, detail = mismatch.partition(": ")
            broken_rule(path, detail)
        for index, (enter, end) in enumerate(zip(self.enter_ns, self.end_ns, strict=True)):
            if end is not None and end < enter:
                broken_rule(f"end_ns[{index}]", f"{end} < enter_ns {enter}")
        return self

    def __len__(self) -> int:
        return len(self.seq)


class Conns(C4Model):
    """Traffic of each of the rank's connections during the interval, columnar."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {"x-c4-rules": ["all four arrays have the same length"]}
    }

    peer: tuple[NonNegInt, ...] = Field(max_length=MAX_ITEMS)
    port: tuple[Id, ...] = Field(max_length=MAX_ITEMS)
    bytes: tuple[NonNegInt, ...] = Field(max_length=MAX_ITEMS)
    busy_ns: tuple[NonNegInt, ...] = Field(max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _check_columns(self) -> Self:
        mismatch = _same_lengths(
            {
                "peer": len(self.peer),
                "port": len(self.port),
                "bytes": len(self.bytes),
                "busy_ns": len(self.busy_ns),
            }
        )
        if mismatch is not None:
            path, _, detail = mismatch.partition(": ")
            broken_rule(path, detail)
        return self


class Collective(C4Model):
    """One rank, one communicator, one reporting interval (empty ops: a heartbeat)."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {
            "x-c4-rules": [
                "rank < comm_size",
                "every conns.peer < comm_size and != rank",
                "send/recv only in a two-member communicator",
            ]
        }
    }

    v: Literal[1]
    kind: Literal["collective"]
    job: Id
    comm: Id
    comm_size: PositiveInt
    rank: NonNegInt
    global_rank: NonNegInt
    node: Id | None = None
    gpu: NonNegInt | None = None
    ts_ns: Nanos
    ops: Ops
    conns: Conns | None = None
    # The job's restart count of the run that reported (as its member reports say): a
    # report of a run the job has left since is that run's, not the current one's.
    restart: NonNegInt | None = None

    @model_validator(mode="after")
    def _check_ranks(self) -> Self:
        if self.rank >= self.comm_size:
            broken_rule("rank", f"{self.rank} >= comm_size {self.comm_size}")
        if self.conns is not None:
            for index, peer in enumerate(self.conns.peer):
                if peer >= self.comm_size:
                    broken_rule(f"conns.peer[{index}]", f"{peer} >= comm_size {self.comm_size}")
                if peer == self.rank:
                    broken_rule(f"conns.peer[{index}]", f"{peer} is the rank itself")
        if self.comm_size != 2:
            for index, name in enumerate(self.ops.op):
                if name in P2P_OPS:
                    broken_rule(
                        f"ops.op[{index}]",
                        f"{name} needs a two-member communicator, comm_size is {self.comm_size}",
                    )
        return self

    @classmethod
    def of(
        cls,
        *,
        job: str,
        comm: str,
        comm_size: int,
        rank: int,
        global_rank: int,
        ts_ns: int,
        ops: Ops,
        node: str | None = None,
        gpu: int | None = None,
        conns: Conns | None = None,
        restart: int | None = None,
        trusted: bool = False,
    ) -> Collective:
        """A v1 collective message (``v`` and ``kind`` filled in), validated; ``trusted``:
        built without validation (``model_construct``), for values known to be valid (the
        simulator's hot path)."""
        make = cls.model_construct if trusted else cls
        return make(
            v=1,
            kind="collective",
            job=job,
            comm=comm,
            comm_size=comm_size,
            rank=rank,
            global_rank=global_rank,
            node=node,
            gpu=gpu,
            ts_ns=ts_ns,
            ops=ops,
            conns=conns,
            restart=restart,
        )


def not_of_the_batch(field: str, value: str, batch_value: str) -> str:
    """Why a message cannot be in a batch of another job or node (``field``: the batch's
    key, which every element shares)."""
    return f"{value!r} is not the batch's {field} {batch_value!r}"


# A batch carries one node's messages of one job for one interval: 8 GPUs x a few tens of
# communicators in practice; the bound keeps one record well under Kafka's 1 MiB default.
MAX_BATCH_MESSAGES = 4096


class Collectives(C4Model):
    """A node's collective messages of one job for one interval, in one Kafka record."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {
            "x-c4-rules": [
                "every messages[i].job equals job",
                "an invalid messages[i] is rejected alone; the others are taken",
                "no messages and a node: that node's agent is up (its presence)",
            ]
        }
    }

    v: Literal[1]
    kind: Literal["collectives"]
    job: Id
    node: Id | None = None
    ts_ns: Nanos
    messages: tuple[Collective, ...] = Field(max_length=MAX_BATCH_MESSAGES)

    @model_validator(mode="after")
    def _check_jobs(self) -> Self:
        for index, message in enumerate(self.messages):
            if message.job != self.job:
                why = not_of_the_batch("job", message.job, self.job)
                broken_rule(f"messages[{index}].job", why)
        return self


class LinkCounters(C4Model):
    """Cumulative NIC port counters; any subset may be present."""

    tx_bytes: NonNegInt | None = None
    rx_bytes: NonNegInt | None = None
    tx_pkts: NonNegInt | None = None
    rx_pkts: NonNegInt | None = None
    tx_wait: NonNegInt | None = None
    symbol_err: NonNegInt | None = None
    link_down: NonNegInt | None = None
    rx_err: NonNegInt | None = None
    out_of_seq: NonNegInt | None = None
    cnp_sent: NonNegInt | None = None
    cnp_handled: NonNegInt | None = None
    timeout_retrans: NonNegInt | None = None


class Link(C4Model):
    """One NIC port: state, speed and counters as the NIC reports them."""

    v: Literal[1]
    kind: Literal["link"]
    node: Id
    port: Id
    ts_ns: Nanos
    state: Literal["up", "down"]
    gbps: NonNegFloat | None = None
    counters: LinkCounters


# The rules of a node's batch (links, gpus): its elements are that node's.
_NODE_BATCH_CONFIG = C4Model.model_config | {
    "json_schema_extra": {
        "x-c4-rules": [
            "every messages[i].node equals node",
            "an invalid messages[i] is rejected alone; the others are taken",
        ]
    }
}


def _of_the_node(messages: Sequence[Link | Gpu], node: str) -> None:
    for index, message in enumerate(messages):
        if message.node != node:
            broken_rule(f"messages[{index}].node", not_of_the_batch("node", message.node, node))


class Links(C4Model):
    """A node's link messages of one interval (one per port), in one Kafka record."""

    model_config = _NODE_BATCH_CONFIG

    v: Literal[1]
    kind: Literal["links"]
    node: Id
    ts_ns: Nanos
    messages: tuple[Link, ...] = Field(max_length=MAX_BATCH_MESSAGES)

    @model_validator(mode="after")
    def _check_nodes(self) -> Self:
        _of_the_node(self.messages, self.node)
        return self


class NeighbourPort(C4Model):
    """One port of the node and the switch port LLDP says its cable goes to."""

    port: Id
    switch: Id
    switch_port: Id | None = None


MAX_NODE_PORTS = 1024  # as many as a topology's node may have


class Neighbours(C4Model):
    """What a node agent's LLDP sees at the far end of each of its ports (``c4 agent
    --lldp``): the facts a miscabled port is found by."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {"x-c4-rules": ["port ids are unique"]}
    }

    v: Literal[1]
    kind: Literal["neighbours"]
    node: Id
    ts_ns: Nanos
    ports: tuple[NeighbourPort, ...] = Field(max_length=MAX_NODE_PORTS)

    @model_validator(mode="after")
    def _check_ports(self) -> Self:
        seen: set[str] = set()
        for index, each in enumerate(self.ports):
            if each.port in seen:
                broken_rule(f"ports[{index}].port", f"{each.port!r} listed twice")
            seen.add(each.port)
        return self


class Gpu(C4Model):
    """One GPU's health; ``xid`` lists the XIDs seen since the previous message."""

    v: Literal[1]
    kind: Literal["gpu"]
    node: Id
    gpu: NonNegInt
    ts_ns: Nanos
    xid: tuple[NonNegInt, ...] = Field(max_length=MAX_ITEMS)
    temp_c: float | None = Field(default=None, strict=True, ge=-273.15)
    power_w: NonNegFloat | None = None
    sm_mhz: NonNegFloat | None = None
    ecc_dbe: NonNegInt | None = None
    retired_pages: NonNegInt | None = None
    throttle: tuple[Id, ...] | None = Field(default=None, max_length=64)
    nvlink_err: NonNegInt | None = None


class Gpus(C4Model):
    """A node's GPU messages of one interval (one per GPU), in one Kafka record."""

    model_config = _NODE_BATCH_CONFIG

    v: Literal[1]
    kind: Literal["gpus"]
    node: Id
    ts_ns: Nanos
    messages: tuple[Gpu, ...] = Field(max_length=MAX_BATCH_MESSAGES)

    @model_validator(mode="after")
    def _check_nodes(self) -> Self:
        _of_the_node(self.messages, self.node)
        return self


class RankPlace(C4Model):
    """Where one global rank of a job runs."""

    rank: NonNegInt
    node: Id
    gpu: NonNegInt | None = None
    port: Id | None = None
    pod: Id | None = None  # Kubernetes: the rank's pod, ``namespace/name``


class Job(C4Model):
    """A job's placement and the members of each of its communicators."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {
            "x-c4-rules": [
                "ranks[].rank are unique",
                "each comms member is unique within its communicator",
            ]
        }
    }

    v: Literal[1]
    kind: Literal["job"]
    job: Id
    ts_ns: Nanos
    state: Literal["running", "restarting", "stopped"]
    ranks: tuple[RankPlace, ...] = Field(max_length=MAX_ITEMS * 16)
    comms: dict[Id, tuple[NonNegInt, ...]] = Field(max_length=MAX_ITEMS)

    @model_validator(mode="after")
    def _check_members(self) -> Self:
        placed: set[int] = set()
        for index, place in enumerate(self.ranks):
            if place.rank in placed:
                broken_rule(f"ranks[{index}].rank", f"rank {place.rank} listed twice")
            placed.add(place.rank)
        for comm, members in self.comms.items():
            seen: set[int] = set()
            for index, member in enumerate(members):
                if member in seen:
                    broken_rule(f"comms.{comm}[{index}]", f"rank {member} listed twice")
                seen.add(member)
        return self


class Suspect(C4Model):
    """One suspected component, with a score in 0..1."""

    type: SuspectType
    id: Id
    score: Score


class Diagnosis(C4Model):
    """A finding of the stream processors; the same ``id`` fires once and resolves once."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {"x-c4-rules": ["ts_ns >= onset_ns"]}
    }

    v: Literal[1]
    kind: Literal["diagnosis"]
    id: Id
    job: Id | None
    state: Literal["firing", "resolved"]
    class_: DiagnosisClass = Field(alias="class")
    onset_ns: Nanos
    ts_ns: Nanos
    suspects: tuple[Suspect, ...] = Field(max_length=1024)
    evidence: dict[str, JsonValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_times(self) -> Self:
        if self.ts_ns < self.onset_ns:
            broken_rule("ts_ns", f"{self.ts_ns} < onset_ns {self.onset_ns}")
        return self


class Action(C4Model):
    """What an action worker did about a diagnosis (the audit trail)."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {"x-c4-rules": ["status skipped/failed carries detail.reason"]}
    }

    v: Literal[1]
    kind: Literal["action"]
    id: Id
    diagnosis: Id | None
    ts_ns: Nanos
    action: ActionName
    target: Id
    status: ActionStatus
    detail: dict[str, JsonValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_reason(self) -> Self:
        if self.status != "done":
            reason = self.detail.get("reason")
            if not isinstance(reason, str) or not reason:
                broken_rule("detail.reason", f"required when status is {self.status}")
        return self


class RoutePath(C4Model):
    """The planned path of one flow leaving this node."""

    flow: Id
    port: Id
    via: Id | None
    sport: int | None = Field(default=None, ge=0, le=65535, strict=True)


class Route(C4Model):
    """A reroute plan for one node."""

    v: Literal[1]
    kind: Literal["route"]
    node: Id
    ts_ns: Nanos
    plan: Id
    paths: tuple[RoutePath, ...] = Field(max_length=MAX_ITEMS)


class Deadletter(C4Model):
    """A rejected message, its reason, and its original bytes as a string."""

    v: Literal[1]
    kind: Literal["deadletter"]
    topic: Text
    ts_ns: Nanos
    error: Text
    payload: Text


# One Slurm or Kubernetes allocation: far more nodes than any cluster has.
MAX_JOB_NODES = 65536


class Member(C4Model):
    """One rank of a job says where it runs (its process group is up); placements are built
    from these."""

    model_config = C4Model.model_config | {
        "json_schema_extra": {"x-c4-rules": ["rank < world_size", "job_nodes are unique"]}
    }

    v: Literal[1]
    kind: Literal["member"]
    job: Id
    ts_ns: Nanos
    rank: NonNegInt
    world_size: PositiveInt
    node: Id
    host: Id | None = None
    local_rank: NonNegInt | None = None
    gpu: NonNegInt | None = None
    gpu_uuid: Id | None = None
    port: Id | None = None
    restart: NonNegInt = 0
    job_nodes: tuple[Id, ...] | None = Field(default=None, max_length=MAX_JOB_NODES)
    pod: Id | None = None  # Kubernetes: ``namespace/name`` from the downward API

    @model_validator(mode="after")
    def _check_rank(self) -> Self:
        if self.rank >= self.world_size:
            broken_rule("rank", f"{self.rank} >= world_size {self.world_size}")
        if self.job_nodes is not None:
            seen: set[str] = set()
            for index, node in enumerate(self.job_nodes):
                if node in seen:
                    broken_rule(f"job_nodes[{index}]", f"{node!r} listed twice")
                seen.add(node)
        return self

    def place(self) -> RankPlace:
        """This rank's place in the job's placement."""
        return RankPlace(rank=self.rank, node=self.node, gpu=self.gpu, port=self.port, pod=self.pod)

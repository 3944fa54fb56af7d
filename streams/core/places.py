"""Where things are: rank -> GPU -> node, port ids, and which job uses a GPU or port."""

from __future__ import annotations

from typing import Protocol

from schemas.messages import Job


def gpu_id(node: str, gpu: int) -> str:
    """The contract's GPU id, ``node-003/gpu1``."""
    return f"{node}/gpu{gpu}"


def port_id(node: str, port: str) -> str:
    """The contract's global NIC port id, ``node-003/mlx5_0:1``."""
    return f"{node}/{port}"


def rank_id(job: str, global_rank: int) -> str:
    """The contract's rank id, ``job-42/rank3`` (global rank)."""
    return f"{job}/rank{global_rank}"


class PortHealth(Protocol):
    """What the link counters say of a NIC port (global id)."""

    def is_down(self, port: str) -> bool:
        """The port reported state down."""
        ...

    def errors_rising(self, port: str) -> bool:
        """Symbol errors or retransmissions grow on the port."""
        ...

    def health_version(self) -> int | None:
        """Moves whenever any port's answer above changes; None when that is not known
        (what is read of it then holds for one look only)."""
        ...


class Routes(Protocol):
    """The planned spine of a connection, when a route plan is known."""

    def via(self, flow: str) -> str | None:
        """The spine of flow ``job/comm/rank->peer``, or None when unknown."""
        ...

    def moved_at(self, flow: str) -> int | None:
        """Event time a plan last moved the flow to another path; None if it never moved."""
        ...

    def generation(self) -> int | None:
        """A number that changes whenever some flow moves; None where moves are learnt
        elsewhere unannounced (then nothing read from ``moved_at`` outlives one check)."""
        ...


def conn_flow(routes: Routes, job: str, comm: str, rank: int, peer: int) -> str:
    """The flow a connection sample of ``rank`` with ``peer`` measured.

    A rank reports the connection it sends on and the one it receives on, both as
    (rank, peer): the second is the flow ``peer->rank``. The plan knows flows by their
    sender, so a sample's path is its own flow's where the plan has it, else the flow that
    arrives at the rank; a pair's two directions are both flows, each reported by its sender.
    """
    flow = f"{job}/{comm}/{rank}->{peer}"
    if routes.via(flow) is None:
        arriving = f"{job}/{comm}/{peer}->{rank}"
        if routes.via(arriving) is not None:
            return arriving
    return flow


class PlacementIndex:
    """Which job runs on each GPU and port, from the ``c4.job.v1`` messages."""

    def __init__(self) -> None:
        self._by_gpu: dict[str, str] = {}
        self._by_port: dict[str, str] = {}
        self._places: dict[str, tuple[list[str], list[str]]] = {}

    def update(self, job: Job) -> None:
        """Record (or, for a stopped job, forget) the places of one job."""
        self.forget(job.job)
        if job.state == "stopped":
            return
        gpus = [gpu_id(p.node, p.gpu) for p in job.ranks if p.gpu is not None]
        ports = [port_id(p.node, p.port) for p in job.ranks if p.port is not None]
        for gpu in gpus:
            self._by_gpu[gpu] = job.job
        for port in ports:
            self._by_port[port] = job.job
        self._places[job.job] = (gpus, ports)

    def forget(self, job: str) -> None:
        """Drop every place of a job."""
        gpus, ports = self._places.pop(job, ([], []))
        for gpu in gpus:
            self._by_gpu.pop(gpu, None)
        for port in ports:
            self._by_port.pop(port, None)

    def job_of_gpu(self, gpu: str) -> str | None:
        """The job running on a GPU (``node/gpuN``)."""
        return self._by_gpu.get(gpu)

    def job_of_port(self, port: str) -> str | None:
        """The job whose ranks use a NIC port (global id)."""
        return self._by_port.get(port)

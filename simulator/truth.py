"""The ground truth of a scenario: per injected fault, what a correct diagnosis names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas.files import Topology
from simulator.cluster import Cluster, build_cluster
from simulator.effects import at_ns
from simulator.scenario import (
    FabricLinkDegraded,
    FabricLinkDown,
    GpuStop,
    LinkDown,
    NodeDown,
    PortDegraded,
    ProcessStuck,
    Scenario,
    SlowGpu,
)

# Acceptable diagnosis classes per fault type, best first.
CLASSES: dict[str, tuple[str, ...]] = {
    "slow_gpu": ("noncomm_slow",),
    "gpu_stop": ("noncomm_hang", "gpu_fault"),
    "process_stuck": ("noncomm_hang",),
    "node_down": ("node_down",),
    "port_degraded": ("comm_slow", "link_degraded"),
    "link_down": ("link_down", "comm_hang"),
    "fabric_link_degraded": ("link_degraded", "comm_slow"),
    # The connections over a dark link crawl (simulator.effects), they do not stop: C4D names
    # it link_down by how far they fell; link_degraded (a crawl read as a share) still names
    # the right link.
    "fabric_link_down": ("link_down", "link_degraded"),
}


@dataclass(frozen=True, slots=True)
class Truth:
    """One injected fault: its onset, the classes that diagnose it, the part to blame."""

    fault: str
    type: str
    job: str | None
    onset_ns: int
    classes: tuple[str, ...]
    suspect_type: str
    suspect_id: str

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Truth:
        """Read one line of a truth file (the inverse of `as_dict`)."""
        return cls(
            fault=str(obj["fault"]),
            type=str(obj["type"]),
            job=obj.get("job"),
            onset_ns=int(obj["onset_ns"]),
            classes=tuple(obj["classes"]),
            suspect_type=str(obj["suspect"]["type"]),
            suspect_id=str(obj["suspect"]["id"]),
        )

    def as_dict(self) -> dict[str, object]:
        """The JSON line of the truth file."""
        return {
            "fault": self.fault,
            "type": self.type,
            "job": self.job,
            "onset_ns": self.onset_ns,
            "classes": list(self.classes),
            "suspect": {"type": self.suspect_type, "id": self.suspect_id},
        }


def ground_truth(
    topology: Topology | None, scenario: Scenario, cluster: Cluster | None = None
) -> list[Truth]:
    """One `Truth` per fault of the scenario, in scenario order (``<type>#<index>``)."""
    if cluster is None:
        cluster = build_cluster(topology, scenario)
    port_job = {
        job.port_id(rank): job.spec.id for job in cluster.jobs for rank in range(job.spec.ranks)
    }
    found = []
    for index, fault in enumerate(scenario.faults):
        job: str | None
        if isinstance(fault, SlowGpu | GpuStop | ProcessStuck):
            job = fault.job
            suspect = ("gpu", cluster.job(job).gpu_id(fault.rank))
        elif isinstance(fault, NodeDown):
            placed = cluster.job_on_node(fault.node)
            job = placed.spec.id if placed else None
            suspect = ("node", fault.node)
        elif isinstance(fault, PortDegraded | LinkDown):
            port = f"{fault.node}/{fault.port}"
            job = port_job.get(port)
            suspect = ("port", port)
        else:
            assert isinstance(fault, FabricLinkDegraded | FabricLinkDown)  # noqa: S101 - the rest
            job = None
            suspect = ("link", fault.link)
        found.append(
            Truth(
                f"{fault.type}#{index}",
                fault.type,
                job,
                at_ns(scenario, fault.at_s),
                CLASSES[fault.type],
                *suspect,
            )
        )
    return found

"""What the dashboard shows, as plain JSON-ready data (pure: no Kafka, no Redis).

The cluster map joins the topology, the component states of the cluster state (a
`RedisState.snapshot`) and the jobs' placements; a fabric link's utilisation is the line rate
of the ring-hop flows routed over it (their paths from the newest ``c4.route.v1`` message of
each node) over the link's speed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from c4.action_notes import note
from planner.reroute import job_flows
from schemas.files import Topology
from schemas.messages import Action, Diagnosis, Job, Route
from topology.model import Fabric

MAX_ACTIONS = 200


@dataclass(frozen=True, slots=True)
class FeedView:
    """A copy of what the feed has seen so far."""

    diagnoses: tuple[Diagnosis, ...] = ()
    actions: tuple[Action, ...] = ()
    routes: tuple[Route, ...] = ()
    jobs: tuple[Job, ...] = ()
    rejected: int = 0

    def open_findings(self) -> list[Diagnosis]:
        """Firing diagnoses not resolved since, oldest first."""
        state: dict[str, Diagnosis] = {}
        for diagnosis in self.diagnoses:
            if diagnosis.state == "firing":
                state.setdefault(diagnosis.id, diagnosis)
            else:
                state[diagnosis.id] = diagnosis
        return [d for d in state.values() if d.state == "firing"]

    def latest_jobs(self) -> list[Job]:
        """Each job's newest placement."""
        latest: dict[str, Job] = {}
        for job in self.jobs:
            if job.job not in latest or job.ts_ns >= latest[job.job].ts_ns:
                latest[job.job] = job
        return [latest[name] for name in sorted(latest)]


def route_vias(routes: Iterable[Route]) -> tuple[dict[str, str | None], str | None]:
    """Each flow's spine from the newest route message of every node, and the newest plan id."""
    latest: dict[str, Route] = {}
    for route in routes:
        if route.node not in latest or route.ts_ns >= latest[route.node].ts_ns:
            latest[route.node] = route
    vias = {path.flow: path.via for route in latest.values() for path in route.paths}
    plan = max(latest.values(), key=lambda r: r.ts_ns).plan if latest else None
    return vias, plan


def link_loads(
    fabric: Fabric, jobs: Iterable[Job], vias: Mapping[str, str | None]
) -> tuple[dict[str, float], dict[str, int], int]:
    """Gbit/s (the busier direction) and flows per fabric link, and the flows without a path.

    A link is full duplex: a flow loads the uplink at its source leaf going up and the one at
    its destination leaf coming down, each direction at the link's speed.
    """
    running = [job.model_copy(update={"state": "running"}) for job in jobs]
    directed: dict[tuple[str, int], float] = {}
    counts: dict[str, int] = {}
    unrouted = 0
    for flow in job_flows(fabric, running).flows:
        src = fabric.port_leaf[fabric.port_index[flow.src]]
        dst = fabric.port_leaf[fabric.port_index[flow.dst]]
        if src == dst:
            continue  # through one leaf: no fabric link
        via = vias.get(flow.id)
        spine = fabric.spine_index.get(via) if via else None
        if spine is None:
            unrouted += 1
            continue
        for direction, leaf in enumerate((src, dst)):
            index = fabric.uplinks[leaf].get(spine)
            if index is None:
                continue
            link = fabric.link_ids[index]
            directed[(link, direction)] = directed.get((link, direction), 0.0) + flow.gbps
            counts[link] = counts.get(link, 0) + 1
    loads: dict[str, float] = {}
    for (link, _), gbps in directed.items():
        loads[link] = max(loads.get(link, 0.0), gbps)
    return loads, counts, unrouted


def cluster_map(topology: Topology, snapshot: Mapping[str, Any], view: FeedView) -> dict[str, Any]:
    """Nodes by state (with their job), fabric links by utilisation, jobs, spares."""
    unusual = {
        (kind, item["id"]): item
        for kind, info in snapshot.get("components", {}).items()
        for item in info.get("not_healthy", ())
    }
    spares = set(snapshot.get("spares", ()))
    job_of = {node: job["job"] for job in snapshot.get("jobs", ()) for node in job.get("nodes", ())}
    nodes = []
    for node in topology.nodes:
        item = unusual.get(("node", node.id), {})
        state = item.get("state") or ("spare" if node.id in spares else "healthy")
        bad_parts = sorted(
            ident
            for (kind, ident), part in unusual.items()
            if kind in {"gpu", "port"}
            and ident.startswith(node.id + "/")
            and part.get("state") in {"isolated", "suspect"}
        )
        nodes.append(
            {
                "id": node.id,
                "state": state,
                "reason": item.get("reason", ""),
                "diagnosis": item.get("diagnosis", ""),
                "job": job_of.get(node.id),
                "leaf": node.ports[0].leaf if node.ports else None,
                "parts": bad_parts,
            }
        )
    fabric = Fabric.from_topology(topology)
    vias, plan = route_vias(view.routes)
    loads, counts, unrouted = link_loads(fabric, view.latest_jobs(), vias)
    links = []
    for link in topology.links:
        item = unusual.get(("link", link.id), {})
        links.append(
            {
                "id": link.id,
                "a": link.a,
                "b": link.b,
                "gbps": link.gbps,
                "state": item.get("state", "healthy"),
                "util": round(loads.get(link.id, 0.0) / link.gbps, 3) if link.gbps else 0.0,
                "flows": counts.get(link.id, 0),
            }
        )
    links.sort(key=lambda item: (-item["util"], item["id"]))
    return {
        "nodes": nodes,
        "links": links,
        "jobs": list(snapshot.get("jobs", ())),
        "spares": sorted(spares),
        "plan": plan,
        "unrouted_flows": unrouted,
        "parts": [
            {"kind": kind, **item}
            for (kind, _), item in sorted(unusual.items())
            if kind in {"gpu", "port", "switch"}
        ],
    }


def finding_json(diagnosis: Diagnosis) -> dict[str, Any]:
    """A finding for the page: class, job, suspects, times and evidence."""
    return {
        "id": diagnosis.id,
        "class": diagnosis.class_,
        "job": diagnosis.job,
        "state": diagnosis.state,
        "onset_ns": diagnosis.onset_ns,
        "ts_ns": diagnosis.ts_ns,
        "suspects": [
            {"type": s.type, "id": s.id, "score": s.score} for s in diagnosis.suspects[:8]
        ],
        "evidence": diagnosis.evidence,
    }


def findings(view: FeedView) -> dict[str, Any]:
    """Open findings (newest first) and how many resolved so far."""
    open_ = sorted(view.open_findings(), key=lambda d: d.ts_ns, reverse=True)
    resolved = {d.id for d in view.diagnoses if d.state == "resolved"}
    return {"open": [finding_json(d) for d in open_], "resolved": len(resolved)}


def action_log(view: FeedView) -> list[dict[str, Any]]:
    """The newest actions first, each with a one-line text."""
    newest = sorted(view.actions, key=lambda a: a.ts_ns, reverse=True)[:MAX_ACTIONS]
    return [
        {
            "id": a.id,
            "ts_ns": a.ts_ns,
            "action": a.action,
            "target": a.target,
            "status": a.status,
            "diagnosis": a.diagnosis,
            "text": note(a).text,
        }
        for a in newest
    ]

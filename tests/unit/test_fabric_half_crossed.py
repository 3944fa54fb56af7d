"""A degraded fabric link that half of a job's connections cross is named, and stays named.

Rings go rail by rail (`topology.traffic`), so every hop of a job on two nodes leaves its
node: on two leaves, half of them can cross one degraded leaf~spine link. The job's slow
connections are then many, not a few outliers; they still all cross that one link.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from scenario_suite import run_case  # noqa: E402

from simulator.cluster import build_cluster
from simulator.scenario import scenario_from

LINK = "leaf-1a~spine-a-0"
SCENARIO = {
    "name": "half-crossed",
    "seed": 4,
    "duration_s": 40,
    "emit_routes": True,
    "fabric": {"nodes_per_leaf": 2, "spines": 2},
    # Two leaf pairs through leaf-1a: job-e from leaf-0a, job-f to leaf-2a.
    "jobs": [
        {"id": "job-e", "ranks": 16, "compute_ms": 120, "nodes": ["node-001", "node-002"]},
        {"id": "job-f", "ranks": 16, "compute_ms": 120, "nodes": ["node-003", "node-004"]},
    ],
    "faults": [{"type": "fabric_link_degraded", "link": LINK, "factor": 0.4, "at_s": 12}],
}


def test_a_link_half_a_job_crosses_is_named_and_stays_named() -> None:
    scenario = scenario_from(SCENARIO)
    cluster = build_cluster(None, scenario)
    crossing = {
        job.spec.id: sum(LINK in conn.links for comm in job.comms for conn in comm.network())
        for job in cluster.jobs
    }
    # Of 16 connections each: more than a quarter of their samples are slow.
    assert crossing["job-e"] > 4 and crossing["job-f"] > 4
    _, findings, _ = run_case(scenario)
    fabric = [f for f in findings if f.job is None and f.class_ == "link_degraded"]
    assert [(f.state, f.suspects[0].id) for f in fabric] == [("firing", LINK)]
    assert not [f for f in findings if f.job is not None]  # no port, no job blamed

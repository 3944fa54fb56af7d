"""``c4 topology import --slurm-conf``: Slurm's topology.conf of a fabric (as ``c4 topology
slurm-conf`` writes it for Slurm) back to a v1 topology that ``c4 state load`` and ``c4 plan``
take as is; each node's one port on the leaf Slurm lists it under."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.integration.fabric_tools import accepted_by_state_and_plan, c4

pytestmark = pytest.mark.integration


def test_topology_conf_round_trip_is_accepted_by_state_and_plan(
    redis_url: str, unique: str, tmp_path: Path
) -> None:
    generated = c4("topology", "gen", "--nodes", "24", "--spines", "3", "--planes", "1")
    assert generated.returncode == 0, generated.stderr
    source = tmp_path / "generated.json"
    source.write_text(generated.stdout)
    conf = tmp_path / "topology.conf"
    written = c4("topology", "slurm-conf", "--topology", str(source), "--out", str(conf))
    assert written.returncode == 0, written.stderr

    out = tmp_path / "topology.json"
    imported = c4("topology", "import", "--slurm-conf", str(conf), "--out", str(out))
    assert imported.returncode == 0, imported.stderr
    assert imported.stderr.splitlines() == [
        "c4: note: topology.conf names no ports: each node gets one port 'node:1' on its leaf "
        "(per node, not per NIC)",
        "c4: note: left out 1 switches with no leaf below: c4-top (a v1 topology has two tiers)",
    ]
    original = orjson.loads(source.read_bytes())
    topology = orjson.loads(out.read_bytes())
    first_leaf = {node["id"]: node["ports"][0]["leaf"] for node in original["nodes"]}
    assert {
        node["id"]: [(p["id"], p["leaf"]) for p in node["ports"]] for node in topology["nodes"]
    } == {node: [("node:1", leaf)] for node, leaf in first_leaf.items()}
    spines = {s["id"] for s in original["switches"] if s["tier"] == 2}
    assert {s["id"] for s in topology["switches"] if s["tier"] == 2} == spines
    assert {(link["a"], link["b"]) for link in topology["links"]} == {
        (leaf, spine) for leaf in set(first_leaf.values()) for spine in spines
    }
    assert "24 nodes" in accepted_by_state_and_plan(out, redis_url, unique)

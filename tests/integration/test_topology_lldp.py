"""LLDP with Debian's lldpd on veth pairs between network namespaces (made and removed here):
``c4 topology import --lldp`` on the real ``lldpcli -f json show neighbors`` of every system,
``c4 agent --lldp`` reporting the same facts, and a cable moved to another leaf found as a
``miscabled`` finding by the detection engine (``c4 diagnose``), with both leaves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.integration.fabric_tools import accepted_by_state_and_plan, c4
from tests.integration.lldp_fabric import LldpFabric

pytestmark = pytest.mark.integration

NODES, LEAVES, SPINE = ("node-001", "node-002"), ("leaf-01", "leaf-02"), "spine-01"
RENAMES = "eth0 mlx5_0:1\neth1 mlx5_1:1\n"  # a site's interface names -> RDMA ports


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LldpFabric]:
    """Each node's eth<k> to leaf-0<k+1> (swp<node>), each leaf's swp9 to the spine."""
    made = LldpFabric(tmp_path_factory.mktemp("lldp"))
    try:
        for name in (*NODES, *LEAVES, SPINE):
            made.system(name)
        for n, node in enumerate(NODES, start=1):
            for k, leaf in enumerate(LEAVES):
                made.cable(node, f"eth{k}", leaf, f"swp{n}")
        for s, leaf in enumerate(LEAVES, start=1):
            made.cable(leaf, "swp9", SPINE, f"swp{s}")
        made.start(switches={*LEAVES, SPINE})
        yield made
    finally:
        made.close()


def expected_neighbours() -> dict[str, set[tuple[str, str]]]:
    seen = {node: {(f"eth{k}", leaf) for k, leaf in enumerate(LEAVES)} for node in NODES}
    for leaf in LEAVES:
        seen[leaf] = {(f"swp{n}", node) for n, node in enumerate(NODES, start=1)}
        seen[leaf].add(("swp9", SPINE))
    seen[SPINE] = {(f"swp{s}", leaf) for s, leaf in enumerate(LEAVES, start=1)}
    return seen


def test_import_from_every_systems_lldpcli_output(
    fabric: LldpFabric, tmp_path: Path, redis_url: str, unique: str
) -> None:
    folder = tmp_path / "lldp"
    folder.mkdir()
    for system, expected in expected_neighbours().items():
        (folder / f"{system}.json").write_text(fabric.wait_for(system, expected))
    renames = tmp_path / "map"
    renames.write_text(RENAMES)
    out = tmp_path / "topology.json"
    result = c4(
        "topology", "import", "--lldp", str(folder), "--map", str(renames), "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    topology = orjson.loads(out.read_bytes())
    assert {
        node["id"]: {port["id"]: port["leaf"] for port in node["ports"]}
        for node in topology["nodes"]
    } == {node: {"mlx5_0:1": "leaf-01", "mlx5_1:1": "leaf-02"} for node in NODES}
    assert {(s["id"], s["tier"]) for s in topology["switches"]} == {
        ("leaf-01", 1),
        ("leaf-02", 1),
        ("spine-01", 2),
    }
    assert sorted(link["id"] for link in topology["links"]) == [
        "leaf-01~spine-01",
        "leaf-02~spine-01",
    ]
    assert "2 nodes" in accepted_by_state_and_plan(out, redis_url, unique)


def agent_report(fabric: LldpFabric, sysfs: Path) -> dict[str, object]:
    """One round of ``c4 agent --lldp`` on node-001, printed."""
    result = c4(
        "agent", "--once", "--print", "--no-sysfs", "--no-nvml", "--lldp",
        "--node", "node-001", "--lldp-socket", str(fabric.sockets["node-001"]),
        "--sysfs-root", str(sysfs),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    messages = [orjson.loads(line) for line in result.stdout.splitlines()]
    assert [m["kind"] for m in messages] == ["neighbours"]
    report: dict[str, object] = messages[0]
    return report


def test_agent_reports_neighbours_and_a_moved_cable_is_miscabled(
    fabric: LldpFabric, tmp_path: Path
) -> None:
    # The node's RDMA ports, as sysfs ties them to interfaces (RoCE).
    sysfs = tmp_path / "sys"
    for k in range(len(LEAVES)):
        ndevs = sysfs / "class" / "infiniband" / f"mlx5_{k}" / "ports" / "1" / "gid_attrs" / "ndevs"
        ndevs.mkdir(parents=True)
        (ndevs / "0").write_text(f"eth{k}\n")
    fabric.wait_for("node-001", expected_neighbours()["node-001"])
    before = agent_report(fabric, sysfs)
    assert before["node"] == "node-001"
    assert before["ports"] == [
        {"port": "mlx5_0:1", "switch": "leaf-01", "switch_port": "swp1"},
        {"port": "mlx5_1:1", "switch": "leaf-02", "switch_port": "swp1"},
    ]
    # The topology as the import above finds it.
    topology = {
        "v": 1,
        "kind": "topology",
        "nodes": [
            {"id": node, "gpus": 8, "ports": [
                {"id": "mlx5_0:1", "leaf": "leaf-01", "gbps": 200},
                {"id": "mlx5_1:1", "leaf": "leaf-02", "gbps": 200},
            ]}
            for node in NODES
        ],
        "switches": [{"id": "leaf-01", "tier": 1}, {"id": "leaf-02", "tier": 1},
                     {"id": SPINE, "tier": 2}],
        "links": [{"id": f"{leaf}~{SPINE}", "a": leaf, "b": SPINE, "gbps": 400}
                  for leaf in LEAVES],
    }  # fmt: skip
    path = tmp_path / "topology.json"
    path.write_bytes(orjson.dumps(topology))

    # node-001's eth1 moved from leaf-02 to leaf-01's spare port.
    fabric.unplug("node-001", "eth1")
    fabric.cable("node-001", "eth1", "leaf-01", "swp7")
    fabric.wait_for("node-001", {("eth0", "leaf-01"), ("eth1", "leaf-01")})
    after = agent_report(fabric, sysfs)
    reports = tmp_path / "reports.jsonl"
    reports.write_bytes(orjson.dumps(before) + b"\n" + orjson.dumps(after) + b"\n")
    diagnosed = c4("diagnose", "--topology", str(path), str(reports))
    assert diagnosed.returncode == 0, diagnosed.stderr
    findings = [orjson.loads(line) for line in diagnosed.stdout.splitlines()]
    assert [(f["class"], f["state"], f["job"]) for f in findings] == [("miscabled", "firing", None)]
    assert findings[0]["suspects"][0] == {"type": "port", "id": "node-001/mlx5_1:1", "score": 1.0}
    assert findings[0]["evidence"] == {
        "port": "node-001/mlx5_1:1",
        "expected_leaf": "leaf-02",
        "found_leaf": "leaf-01",
        "switch_port": "swp7",
    }

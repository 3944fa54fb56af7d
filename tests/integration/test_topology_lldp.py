"""LLDP with Debian's lldpd on veth pairs between network namespaces (made and removed here):
``c4 topology import --lldp`` on the real ``lldpcli -f json show neighbors`` of every system,
``c4 agent --lldp`` reporting the same facts, and a cable moved to another leaf found as a
``miscabled`` finding, with both leaves: by the detection engine offline (``c4 diagnose``) and
live, the agent publishing to Kafka and the detection worker (``faust -A c4.faust_app``)
reading it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from schemas.codec import encode
from tests.integration.fabric_tools import accepted_by_state_and_plan, c4
from tests.integration.live_runs import DiagnosisReader
from tests.integration.lldp_fabric import LldpFabric
from tests.integration.test_live_detection import KINDS
from tests.integration.workers import REPO, create_topics

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


def agent(fabric: LldpFabric, sysfs: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """One round of ``c4 agent --lldp`` on node-001 (its stdout)."""
    result = c4(
        "agent", "--once", "--no-sysfs", "--no-nvml", "--lldp", "--node", "node-001",
        "--lldp-socket", str(fabric.sockets["node-001"]), "--sysfs-root", str(sysfs), *args,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def agent_report(fabric: LldpFabric, sysfs: Path) -> dict[str, object]:
    """One round of ``c4 agent --lldp`` on node-001, printed."""
    printed = agent(fabric, sysfs, "--print")
    messages = [orjson.loads(line) for line in printed.splitlines()]
    assert [m["kind"] for m in messages] == ["neighbours"]
    report: dict[str, object] = messages[0]
    return report


def test_agent_reports_neighbours_and_a_moved_cable_is_miscabled(
    fabric: LldpFabric, tmp_path: Path, kafka_bootstrap: str, unique: str
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

    live = live_findings(fabric, sysfs, path, tmp_path, kafka_bootstrap, unique)
    assert [(d["class"], d["state"], d["evidence"]) for d in live] == [
        ("miscabled", "firing", findings[0]["evidence"])
    ]


def live_findings(
    fabric: LldpFabric, sysfs: Path, topology: Path, tmp_path: Path, bootstrap: str, unique: str
) -> list[dict[str, object]]:
    """The agent publishes a round to Kafka; the detection worker (with the topology) reads
    it: the findings on the diagnosis topic."""
    prefix = f"test.{unique}."
    create_topics(bootstrap, [f"{prefix}c4.{kind}.v1" for kind in KINDS], 2)
    env = {
        "C4_KAFKA_BOOTSTRAP": bootstrap,
        "C4_TOPIC_PREFIX": prefix,
        "C4_TOPIC_PARTITIONS": "2",
        "C4_STACK_DIR": str(tmp_path / "stack"),
        "C4_STREAMS_APP_ID": f"test-{unique}",
        "C4_STREAMS_METRICS_PORT": "0",
        "C4_STREAMS_TOPOLOGY": str(topology),
    }
    log_path = tmp_path / "faust.log"
    argv = [sys.executable, "-m", "faust", "-A", "c4.faust_app", "worker", "-l", "warn"]
    with log_path.open("wb") as log:
        worker = subprocess.Popen(  # noqa: S603 - fixed argv
            [*argv, "--without-web"],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(REPO), **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        agent(fabric, sysfs, "--spool-dir", str(tmp_path / "spool"), env=env)
        reader = DiagnosisReader(bootstrap, f"{prefix}c4.diagnosis.v1", f"check-{unique}")

        def alive() -> None:
            assert worker.poll() is None, log_path.read_text()[-3000:]

        found = reader.until(lambda f: any(d.class_ == "miscabled" for d in f), 120, alive)
        reader.close()
    finally:
        worker.terminate()
        worker.wait(30)
    return [orjson.loads(encode(d)) for d in found]

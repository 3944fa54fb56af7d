"""``c4 topology import --ibnetdiscover`` on the real ``ibnetdiscover`` (infiniband-diags) run
against a fabric simulated by ibsim (ibsim-utils; ``ibsim-run`` preloads umad2sim, so no
kernel module or HCA is needed): a rail-optimised two-tier fat tree, every host, port, leaf,
spine and cable found; a cable moved in the netlist shows in ``c4 topology diff``."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from c4.stack.supervise import installed
from tests.integration.fabric_tools import accepted_by_state_and_plan, c4

pytestmark = pytest.mark.integration

GROUPS, HOSTS_PER_GROUP, RAILS, SPINES = 3, 4, 8, 4
LEAF_PORTS = HOSTS_PER_GROUP + SPINES + 4  # 4 spare ports, where a moved cable can go
MOVED = ("node-001", 2)  # host 1's rail-2 HCA, moved from leaf-0-r2 to leaf-1-r2's spare port


def _host(group: int, index: int) -> str:
    return f"node-{group * HOSTS_PER_GROUP + index:03d}"


def netlist(moved: bool) -> str:
    """ibsim's netlist (ibnetdiscover's own format) of the fat tree: in each group, rail r of
    every host goes to the group's leaf ``leaf-<g>-r<r>``; every leaf has one cable to every
    spine. With ``moved``, `MOVED` is cabled to the next group's leaf of its rail."""
    cabled: dict[tuple[str, int], tuple[str, int]] = {}  # (host, rail) -> (leaf, port)
    for group in range(GROUPS):
        for index in range(HOSTS_PER_GROUP):
            for rail in range(RAILS):
                cabled[(_host(group, index), rail)] = (f"leaf-{group}-r{rail}", index + 1)
    if moved:
        cabled[MOVED] = (f"leaf-1-r{MOVED[1]}", LEAF_PORTS)
    records = []
    for group in range(GROUPS):
        for rail in range(RAILS):
            leaf = f"leaf-{group}-r{rail}"
            lines = [f'Switch\t{LEAF_PORTS} "{leaf}"']
            lines += [
                f'[{port}]\t"{host} mlx5_{r}"[1]'
                for (host, r), (name, port) in sorted(cabled.items(), key=lambda item: item[1])
                if name == leaf
            ]
            port = HOSTS_PER_GROUP
            for spine in range(SPINES):
                leaf_index = group * RAILS + rail
                lines.append(f'[{port + spine + 1}]\t"spine-{spine}"[{leaf_index + 1}]')
            records.append("\n".join(lines))
    for spine in range(SPINES):
        lines = [f'Switch\t{GROUPS * RAILS} "spine-{spine}"']
        for group in range(GROUPS):
            for rail in range(RAILS):
                leaf_port = HOSTS_PER_GROUP + spine + 1
                lines.append(f'[{group * RAILS + rail + 1}]\t"leaf-{group}-r{rail}"[{leaf_port}]')
        records.append("\n".join(lines))
    for (host, rail), (leaf, port) in cabled.items():
        records.append(f'Hca\t1 "{host} mlx5_{rail}"\n[1]\t"{leaf}"[{port}]')
    return "\n\n".join(records) + "\n"


@pytest.fixture(scope="module")
def tools() -> tuple[str, str]:
    """ibsim and ibnetdiscover, installed from Debian when missing."""
    ibsim = installed("ibsim", ("ibsim-utils",), "apt-get install -y ibsim-utils")
    ibnetdiscover = installed(
        "ibnetdiscover", ("infiniband-diags",), "apt-get install -y infiniband-diags"
    )
    installed("ibsim-run", ("ibsim-utils",), "apt-get install -y ibsim-utils")
    return ibsim, ibnetdiscover


def discover(tools: tuple[str, str], net: Path) -> str:
    """Start ibsim on the netlist (a socket name of its own), run ibnetdiscover under
    ibsim-run until the simulated subnet answers, stop ibsim; ibnetdiscover's output."""
    ibsim, ibnetdiscover = tools
    env = dict(os.environ, IBSIM_SOCKNAME=f"c4test-{uuid.uuid4().hex[:8]}")
    log = net.with_suffix(".ibsim.log")
    with log.open("wb") as out:
        simulator = subprocess.Popen(  # noqa: S603 - fixed argv
            [ibsim, "-s", "-n", str(net)], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert simulator.poll() is None, f"ibsim exited: {log.read_text()[-2000:]}"
            result = subprocess.run(  # noqa: S603 - fixed argv
                ["ibsim-run", ibnetdiscover, "-f"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            if result.returncode == 0 and "Switch" in result.stdout:
                return result.stdout
            assert time.monotonic() < deadline, f"ibnetdiscover: {result.stderr[-2000:]}"
            time.sleep(0.5)
    finally:
        simulator.terminate()
        simulator.wait(timeout=30)


@pytest.fixture(scope="module")
def discovered(
    tools: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path]]:
    """ibnetdiscover's files of the fabric as cabled and with `MOVED` moved."""
    folder = tmp_path_factory.mktemp("ibsim")
    outputs = []
    for moved in (False, True):
        net = folder / f"net-{int(moved)}"
        net.write_text(netlist(moved))
        output = folder / f"ibnetdiscover-{int(moved)}.txt"
        output.write_text(discover(tools, net))
        outputs.append(output)
    yield outputs[0], outputs[1]


def test_every_host_port_leaf_spine_and_cable_is_found(
    discovered: tuple[Path, Path], redis_url: str, unique: str, tmp_path: Path
) -> None:
    out = tmp_path / "topology.json"
    result = c4("topology", "import", "--ibnetdiscover", str(discovered[0]), "--out", str(out))
    assert result.returncode == 0, result.stderr
    topology = orjson.loads(out.read_bytes())
    hosts = {_host(g, i) for g in range(GROUPS) for i in range(HOSTS_PER_GROUP)}
    assert {node["id"] for node in topology["nodes"]} == hosts
    cabled = {
        (node["id"], port["id"]): port["leaf"]
        for node in topology["nodes"]
        for port in node["ports"]
    }
    assert cabled == {
        (_host(g, i), f"mlx5_{r}:1"): f"leaf-{g}-r{r}"
        for g in range(GROUPS)
        for i in range(HOSTS_PER_GROUP)
        for r in range(RAILS)
    }
    leaves = {f"leaf-{g}-r{r}" for g in range(GROUPS) for r in range(RAILS)}
    spines = {f"spine-{s}" for s in range(SPINES)}
    tiers = {switch["id"]: switch["tier"] for switch in topology["switches"]}
    assert tiers == {**dict.fromkeys(leaves, 1), **dict.fromkeys(spines, 2)}
    assert {(link["a"], link["b"]) for link in topology["links"]} == {
        (leaf, spine) for leaf in leaves for spine in spines
    }
    # ibsim's links train at 4xSDR (4 lanes of 2.5 Gb/s); ibnetdiscover prints it, we read it.
    speeds = {port["gbps"] for node in topology["nodes"] for port in node["ports"]}
    assert speeds | {link["gbps"] for link in topology["links"]} == {10.0}
    loaded = accepted_by_state_and_plan(out, redis_url, unique)
    assert f"{len(hosts)} nodes" in loaded


def test_a_moved_cable_shows_in_topology_diff(
    discovered: tuple[Path, Path], tmp_path: Path
) -> None:
    files = []
    for index, source in enumerate(discovered):
        out = tmp_path / f"topology-{index}.json"
        result = c4("topology", "import", "--ibnetdiscover", str(source), "--out", str(out))
        assert result.returncode == 0, result.stderr
        files.append(str(out))
    same = c4("topology", "diff", files[0], files[0])
    assert (same.returncode, same.stdout) == (0, "")
    moved = c4("topology", "diff", *files)
    assert moved.returncode == 1, moved.stderr
    node, rail = MOVED
    assert moved.stdout.splitlines() == [
        f"moved {node}/mlx5_{rail}:1: leaf-0-r{rail} -> leaf-1-r{rail}"
    ]

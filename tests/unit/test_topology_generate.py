from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from c4.cli import main
from schemas.codec import decode, encode
from schemas.files import Topology
from topology.generate import Shape, ShapeError, generate, layout
from topology.model import Fabric


def run_command(argv: list[str]) -> int:
    """Run the real ``c4`` entry point in this process (its errors printed as users see them)."""
    return main(argv)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(1, 40),
    spines=st.integers(1, 6),
    nics=st.integers(1, 4),
    planes=st.sampled_from([1, 2]),
    per_leaf=st.one_of(st.none(), st.integers(1, 9)),
)
def test_generated_topology_decodes_and_has_the_shape(
    nodes: int, spines: int, nics: int, planes: int, per_leaf: int | None
) -> None:
    shape = Shape(nodes=nodes, spines=spines, nics=nics, planes=planes, nodes_per_leaf=per_leaf)
    topo = generate(shape)
    assert isinstance(decode(encode(topo), "topology"), Topology)
    fabric = Fabric.from_topology(topo)
    plan = layout(shape)
    assert len(fabric.planes) == planes
    assert len(fabric.spines) == spines * planes
    assert len(fabric.leaves) == plan.leaves_per_plane * planes
    assert len(fabric.ports) == nodes * nics * 2
    for node in topo.nodes:
        for nic in range(nics):
            one = fabric.ports[f"{node.id}/mlx5_{nic}:1"]
            two = fabric.ports[f"{node.id}/mlx5_{nic}:2"]
            assert one.leaf != two.leaf  # each port on its own leaf
            same_plane = fabric.plane_of(one.id) == fabric.plane_of(two.id)
            assert same_plane == (planes == 1)
    per_leaf_count = Counter(port.leaf for port in fabric.ports.values())
    assert max(per_leaf_count.values()) <= plan.nodes_per_leaf * nics


def test_contract_style_ids() -> None:
    topo = generate(Shape(nodes=16, spines=4))
    fabric = Fabric.from_topology(topo)
    assert fabric.ports["node-000/mlx5_0:1"].leaf == "leaf-0a"
    assert fabric.ports["node-000/mlx5_0:2"].leaf == "leaf-0b"
    assert fabric.ports["node-008/mlx5_0:1"].leaf == "leaf-1a"
    assert topo.links[0].id == "leaf-0a~spine-a-0"
    assert fabric.capacity("node-008/mlx5_7:2") == 200.0
    assert fabric.capacity("leaf-1b~spine-b-3") == 400.0


def test_leaves_per_plane_sets_nodes_per_leaf() -> None:
    assert layout(Shape(nodes=64, spines=2, leaves_per_plane=4)).nodes_per_leaf == 16
    assert layout(Shape(nodes=64, spines=2, planes=1, leaves_per_plane=4)).nodes_per_leaf == 32


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (Shape(nodes=0, spines=1), "--nodes must be at least 1, got 0"),
        (Shape(nodes=4, spines=0), "--spines must be at least 1, got 0"),
        (Shape(nodes=4, spines=1, planes=3), "--planes must be 1 or 2"),
        (Shape(nodes=4, spines=1, port_gbps=0.0), "--port-gbps must be a positive number"),
        (Shape(nodes=4, spines=1, nics=600), "--nics must be at most 512"),
        (Shape(nodes=64, spines=1, nodes_per_leaf=8, leaves_per_plane=4), "too few"),
        (Shape(nodes=8, spines=1, planes=1, leaves_per_plane=3), "must be even"),
    ],
)
def test_bad_shapes(shape: Shape, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        generate(shape)


def test_cli_writes_a_valid_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    argv = ["topology", "gen", "--nodes", "16", "--spines", "4", "--nics", "2"]
    assert run_command([*argv, "--out", str(out)]) == 0
    topo = decode(out.read_bytes(), "topology")
    assert isinstance(topo, Topology)
    assert len(topo.nodes) == 16
    assert run_command(argv) == 0
    assert orjson.loads(capsys.readouterr().out) == orjson.loads(out.read_bytes())


@pytest.mark.parametrize(
    "extra",
    [["--nodes", "0", "--spines", "4"], ["--nodes", "4", "--spines", "4", "--planes", "5"]],
)
def test_cli_bad_arguments_one_line_exit_two(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_command(["topology", "gen", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("c4: error: --")
    assert captured.err.count("\n") == 1


def test_cli_unwritable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "t.json"
    code = run_command(["topology", "gen", "--nodes", "2", "--spines", "1", "--out", str(target)])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No such file" in err

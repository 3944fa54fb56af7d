from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from schemas.codec import decode, encode
from schemas.files import Plan
from tests.unit.test_topology_generate import run_command
from topology.ecmp import choose_spine, hash_model
from topology.generate import Shape, generate
from topology.model import Fabric

FLOWS: dict[str, Any] = {
    "v": 1,
    "kind": "flows",
    "flows": [
        {"id": "f1", "src": "node-000/mlx5_0:1", "dst": "node-008/mlx5_0:1", "gbps": 200},
        {"id": "f2", "src": "node-001/mlx5_0:1", "dst": "node-009/mlx5_0:1", "gbps": 200},
        {"id": "f3", "src": "node-002/mlx5_0:1", "dst": "node-003/mlx5_0:1", "gbps": 100},
    ],
    "down": ["leaf-0a~spine-a-0"],
}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    topology = tmp_path / "topology.json"
    topology.write_bytes(encode(generate(Shape(nodes=16, spines=4, nics=1))))
    flows = tmp_path / "flows.json"
    flows.write_bytes(orjson.dumps(FLOWS))
    return topology, flows


def test_prints_a_v1_plan(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    topology, flows = files
    assert run_command(["plan", "--topology", str(topology), "--flows", str(flows)]) == 0
    result = decode(capsys.readouterr().out.encode(), "plan")
    assert isinstance(result, Plan)
    assert [path.flow for path in result.paths] == ["f1", "f2", "f3"]
    assert result.paths[0].via != result.paths[1].via  # two 200G flows, one 400G uplink each
    assert "leaf-0a~spine-a-0" not in {link for path in result.paths for link in path.links}
    assert result.paths[2].via is None
    assert result.max_util == 1.0


def test_hash_adds_a_source_port_that_steers_each_flow(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    topology, flows = files
    out = tmp_path / "plan.json"
    argv = ["plan", "--topology", str(topology), "--flows", str(flows), "--hash", "xor-fold"]
    assert run_command([*argv, "--out", str(out)]) == 0
    document = orjson.loads(out.read_bytes())
    assert isinstance(decode(out.read_bytes(), "plan"), Plan)  # still a valid v1 plan
    fabric = Fabric.from_topology(generate(Shape(nodes=16, spines=4, nics=1)))
    for path, flow in zip(document["paths"], FLOWS["flows"], strict=True):
        spine = choose_spine(
            fabric, hash_model("xor-fold"), flow["src"], flow["dst"], path["sport"], FLOWS["down"]
        )
        assert spine == path["via"]


def bad(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("flows", "code", "message"),
    [
        (b"{not json", 1, "invalid JSON"),
        (orjson.dumps({"v": 1, "kind": "plan", "paths": [], "max_util": 0}), 1, "expected 'flows'"),
        (
            orjson.dumps(FLOWS | {"flows": [FLOWS["flows"][0] | {"gbps": -1}]}),
            1,
            "flows[0].gbps",
        ),
        (
            orjson.dumps(FLOWS | {"flows": [FLOWS["flows"][0] | {"dst": "node-008/mlx5_0:2"}]}),
            1,
            "different planes",
        ),
        (
            orjson.dumps(FLOWS | {"flows": [FLOWS["flows"][0] | {"dst": "node-099/mlx5_0:1"}]}),
            1,
            "unknown port 'node-099/mlx5_0:1'",
        ),
        (orjson.dumps(FLOWS | {"down": ["leaf-9z~spine-a-0"]}), 1, "unknown link"),
    ],
)
def test_bad_input_is_one_line(
    files: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flows: bytes,
    code: int,
    message: str,
) -> None:
    topology, _ = files
    argv = ["plan", "--topology", str(topology), "--flows", bad(tmp_path, "f.json", flows)]
    assert run_command(argv) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("c4: error: ")
    assert captured.err.count("\n") == 1
    assert message in captured.err


def test_missing_file_exits_two(
    files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, flows = files
    argv = ["plan", "--topology", str(tmp_path / "absent.json"), "--flows", str(flows)]
    assert run_command(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No such file" in err


def test_unknown_hash_model_is_a_usage_error(files: tuple[Path, Path]) -> None:
    topology, flows = files
    with pytest.raises(SystemExit) as caught:
        run_command(["plan", "--topology", str(topology), "--flows", str(flows), "--hash", "md5"])
    assert caught.value.code == 2

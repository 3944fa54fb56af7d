"""``c4 topology import`` and ``c4 topology diff`` through the real entry point, on output
captured from the real tools (ibnetdiscover on ibsim, lldpcli on lldpd) and on broken input."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from c4.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures" / "fabric"
IBNETDISCOVER = FIXTURES / "ibnetdiscover-full.txt"


def imported(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["topology", "import", *args]) == 0
    document: dict[str, object] = orjson.loads(capsys.readouterr().out)
    return document


def failed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["topology", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_ibnetdiscover_hosts_ports_tiers_links_and_speeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    topology = imported(capsys, "--ibnetdiscover", str(IBNETDISCOVER), "--gpus", "4")
    assert topology == {
        "v": 1,
        "kind": "topology",
        "nodes": [
            {
                "id": "node-001",
                "gpus": 4,
                "ports": [{"id": "mlx5_0:1", "leaf": "leaf-a", "gbps": 10.0}],
            }
        ],
        "switches": [{"id": "spine-1", "tier": 2}, {"id": "leaf-a", "tier": 1}],
        "links": [{"id": "leaf-a~spine-1", "a": "leaf-a", "b": "spine-1", "gbps": 10.0}],
    }


def test_ibnetdiscover_speed_from_width_and_rate_else_the_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = IBNETDISCOVER.read_text()
    ndr = tmp_path / "ndr.txt"
    ndr.write_text(text.replace("4xSDR", "4xNDR"))
    topology = imported(capsys, "--ibnetdiscover", str(ndr))
    assert topology["nodes"][0]["ports"][0]["gbps"] == 400.0  # type: ignore[index]
    assert topology["links"][0]["gbps"] == 400.0  # type: ignore[index]
    bare = tmp_path / "bare.txt"
    bare.write_text(text.replace(" 4xSDR s=1 w=2 v=4", ""))
    topology = imported(capsys, "--ibnetdiscover", str(bare), "--port-gbps", "100")
    assert topology["nodes"][0]["ports"][0]["gbps"] == 100.0  # type: ignore[index]
    assert topology["links"][0]["gbps"] == 400.0  # type: ignore[index]


def test_ibnetdiscover_map_renames_by_guid_description_and_host(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    renames = tmp_path / "map"
    renames.write_text('# site names\n0x200001 spine-01\n"leaf-a" leaf-01\nnode-001 gpu-001\n')
    topology = imported(capsys, "--ibnetdiscover", str(IBNETDISCOVER), "--map", str(renames))
    assert [s["id"] for s in topology["switches"]] == ["spine-01", "leaf-01"]  # type: ignore[attr-defined]
    assert topology["nodes"][0]["id"] == "gpu-001"  # type: ignore[index]
    assert topology["nodes"][0]["ports"][0]["leaf"] == "leaf-01"  # type: ignore[index]


def test_ibnetdiscover_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with IBNETDISCOVER.open("rb") as stream:
        monkeypatch.setattr("sys.stdin", type("Stdin", (), {"buffer": stream})())
        topology = imported(capsys, "--ibnetdiscover", "-")
    assert [node["id"] for node in topology["nodes"]] == ["node-001"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("edit", "line", "reason"),
    [
        (lambda t: t.replace('[2]\t"S-', '[2]\t"S-0000000000209999"[1]\n[x]\t"S-'), 20, "not an"),
        (
            lambda t: t.replace('"node-001 mlx5_0" lid', "lid").replace(
                '# "node-001 mlx5_0"', '# "MT4129 ConnectX7   Mellanox Technologies"'
            ),
            25,
            "not '<host> <device>'",
        ),
        (
            lambda t: t.replace(
                "\n\nvendid=0x0\ndevid=0x0\nsysimgguid=0x100000",
                '\n[3]\t"S-00000000002000ff"[1]\n\nvendid=0x0\ndevid=0x0\nsysimgguid=0x100000',
            ),
            20,
            "no record",
        ),
        (lambda t: '[1]\t"H-1"[1]\n' + t, 1, "before any Switch"),
        (lambda t: t + 'Ca\t1 "H-0000000000100000"\t# "x y"\n', 27, "listed twice"),
        (lambda t: "hello\n", 1, "not an ibnetdiscover line"),
        (lambda t: "# only comments\n", 1, "no Switch or Ca record"),
    ],
)
def test_ibnetdiscover_bad_input_is_one_line_with_its_number(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: object, line: int, reason: str
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(edit(IBNETDISCOVER.read_text()))  # type: ignore[operator]
    message = failed(capsys, "import", "--ibnetdiscover", str(bad))
    assert message.startswith(f"c4: error: {bad}:{line}: "), message
    assert reason in message


def test_bad_map_line_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    renames = tmp_path / "map"
    renames.write_text("a b\n0xzz leaf\n")
    message = failed(capsys, "import", "--ibnetdiscover", str(IBNETDISCOVER), "--map", str(renames))
    assert message == f"c4: error: {renames}:2: bad GUID '0xzz'"


SLURM_CONF = """\
# a site's topology.conf
SwitchName=leaf01 Nodes=gpu[000-003]
SwitchName=leaf02 Nodes=gpu[004-005],gpu007 \\
  LinkSpeed=100
SwitchName=spine Switches=leaf[01-02]
"""


def test_slurm_conf_ports_per_node_and_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(SLURM_CONF)
    assert main(["topology", "import", "--slurm-conf", str(conf)]) == 0
    captured = capsys.readouterr()
    assert "one port 'node:1' on its leaf (per node, not per NIC)" in captured.err
    topology = orjson.loads(captured.out)
    leaves = {node["id"]: [p["leaf"] for p in node["ports"]] for node in topology["nodes"]}
    assert leaves == {
        **{f"gpu{n:03d}": ["leaf01"] for n in range(4)},
        **{f"gpu{n:03d}": ["leaf02"] for n in (4, 5, 7)},
    }
    assert topology["switches"] == [
        {"id": "leaf01", "tier": 1},
        {"id": "leaf02", "tier": 1},
        {"id": "spine", "tier": 2},
    ]
    assert [link["id"] for link in topology["links"]] == ["leaf01~spine", "leaf02~spine"]


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("SwitchName=a Nodes=n1\nSwitchName=a Nodes=n2\n", 2, "already defined on line 1"),
        ("SwitchName=a Nodes=n1\nSwitchName=b Nodes=n[1-2]\n", 2, "under 'a' already"),
        ("SwitchName=a Nodes=n1\n\nSwitchName=s Switches=b\n", 3, "switch 'b' is not defined"),
        ("SwitchName=a Nodes=n[1-\n", 1, "n[1-"),
        ("SwitchName=a Nodes=n1\nNodes=n2\n", 2, "no SwitchName="),
        ("SwitchName=a Port=3\n", 1, "not a topology.conf setting"),
    ],
)
def test_slurm_conf_bad_input_is_one_line_with_its_number(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, line: int, reason: str
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(text)
    message = failed(capsys, "import", "--slurm-conf", str(conf))
    assert message.startswith(f"c4: error: {conf}:{line}: "), message
    assert reason in message


def test_lldp_captured_from_lldpd(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "lldp"
    folder.mkdir()
    shutil.copy(FIXTURES / "lldp-node-001.json", folder / "node-001.json")
    shutil.copy(FIXTURES / "lldp-none.json", folder / "node-002")  # .json may be left out
    renames = tmp_path / "map"
    renames.write_text("n-eth0 mlx5_0:1\nn-eth1 mlx5_1:1\n")
    topology = imported(capsys, "--lldp", str(folder), "--map", str(renames))
    assert topology["nodes"] == [
        {
            "id": "node-001",
            "gpus": 8,
            "ports": [
                {"id": "mlx5_0:1", "leaf": "leaf-01", "gbps": 200.0},
                {"id": "mlx5_1:1", "leaf": "leaf-01", "gbps": 200.0},
            ],
        }
    ]
    assert topology["switches"] == [{"id": "leaf-01", "tier": 1}]


def test_lldp_switch_files_give_the_uplinks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def capabilities(chassis: str) -> list[dict[str, object]]:
        switch = not chassis.startswith("node")
        return [{"type": "Bridge", "enabled": switch}, {"type": "Station", "enabled": not switch}]

    def neighbours(*pairs: tuple[str, str, str]) -> bytes:
        interfaces = [
            {
                local: {
                    "chassis": {chassis: {"id": {}, "capability": capabilities(chassis)}},
                    "port": {"id": {"type": "ifname", "value": port}},
                }
            }
            for local, chassis, port in pairs
        ]
        return orjson.dumps({"lldp": {"interface": interfaces}})

    (tmp_path / "node-001.json").write_bytes(neighbours(("eth0", "leaf-1", "swp1")))
    (tmp_path / "node-002.json").write_bytes(neighbours(("eth0", "leaf-2", "swp1")))
    (tmp_path / "leaf-1.json").write_bytes(
        neighbours(("swp1", "node-001", "eth0"), ("swp9", "spine", "swp1"))
    )
    (tmp_path / "leaf-2.json").write_bytes(neighbours(("swp9", "spine", "swp2")))
    (tmp_path / "spine.json").write_bytes(neighbours(("swp1", "leaf-1", "swp9")))
    topology = imported(capsys, "--lldp", str(tmp_path))
    tiers = {s["id"]: s["tier"] for s in topology["switches"]}  # type: ignore[attr-defined]
    assert tiers == {"leaf-1": 1, "leaf-2": 1, "spine": 2}
    assert sorted(link["id"] for link in topology["links"]) == ["leaf-1~spine", "leaf-2~spine"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ('{"lldp": {\n  "interface": {\n    "eth0": {"chassis": {}}\n  }\n}}\n', 3, "'eth0'"),
        ('{"lldp": {\n  "interface": [\n    1,\n  ]}}\n', 3, "invalid JSON"),
        ('{"lldp": []}\n', 1, "no 'lldp' object"),
    ],
)
def test_lldp_bad_input_is_one_line_with_its_number(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, line: int, reason: str
) -> None:
    (tmp_path / "node-001.json").write_text(text)
    message = failed(capsys, "import", "--lldp", str(tmp_path))
    assert message.startswith(f"c4: error: {tmp_path / 'node-001.json'}:{line}: "), message
    assert reason in message


def test_diff_names_moved_missing_and_new(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def topology(ports: dict[str, str], switches: list[tuple[str, int]]) -> str:
        path = tmp_path / f"t{len(list(tmp_path.iterdir()))}.json"
        nodes = [
            {"id": node, "gpus": 8, "ports": [{"id": "mlx5_0:1", "leaf": leaf, "gbps": 200}]}
            for node, leaf in ports.items()
        ]
        path.write_bytes(
            orjson.dumps(
                {
                    "v": 1,
                    "kind": "topology",
                    "nodes": nodes,
                    "switches": [{"id": s, "tier": t} for s, t in switches],
                    "links": [],
                }
            )
        )
        return str(path)

    old = topology({"n1": "leaf-a", "n2": "leaf-a", "n3": "leaf-b"}, [("leaf-a", 1), ("leaf-b", 1)])
    new = topology(
        {"n1": "leaf-b", "n3": "leaf-b", "n4": "leaf-c"},
        [("leaf-a", 1), ("leaf-b", 1), ("leaf-c", 1)],
    )
    assert main(["topology", "diff", old, old]) == 0
    assert capsys.readouterr().out == ""
    assert main(["topology", "diff", old, new]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "moved n1/mlx5_0:1: leaf-a -> leaf-b",
        "missing n2/mlx5_0:1: port was on leaf-a",
        "new n4/mlx5_0:1: port on leaf-c",
        "new leaf-c: switch (tier 1)",
    ]
    (tmp_path / "broken.json").write_text("{")
    assert "broken.json" in failed(capsys, "diff", old, str(tmp_path / "broken.json"))


def test_what_two_tiers_cannot_hold_is_left_out_and_said(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(
        "SwitchName=l1 Nodes=n1\nSwitchName=l2 Nodes=n2 Switches=l1\n"
        "SwitchName=s1 Switches=l1,l2\nSwitchName=s2 Switches=l2\nSwitchName=top Switches=s1,s2\n"
    )
    assert main(["topology", "import", "--slurm-conf", str(conf)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[1:] == [
        "c4: note: left out 1 switches with no leaf below: top (a v1 topology has two tiers)",
        "c4: note: left out 1 cables within a tier: l1~l2 (a v1 topology has two tiers)",
    ]
    topology = orjson.loads(captured.out)
    assert [s["id"] for s in topology["switches"]] == ["l1", "l2", "s1", "s2"]
    assert [link["id"] for link in topology["links"]] == ["l1~s1", "l2~s1", "l2~s2"]


# A dual-port HCA, two parallel leaf-spine cables and NVIDIA switch descriptions, written as
# ibnetdiscover writes them.
DUAL = """\
switchguid=0x10(10)
Switch\t40 "S-0000000000000010"\t\t# "MF0;leaf-07:MQM9700/U1" enhanced port 0 lid 3 lmc 0
[1]\t"H-0000000000000001"[1](2) \t\t# "gpu07 mlx5_0" lid 5 4xNDR
[2]\t"H-0000000000000001"[2](3) \t\t# "gpu07 mlx5_0" lid 6 2xNDR
[33]\t"S-0000000000000020"[1]\t\t# "MF0;spine-1:MQM9700/U1" lid 4 4xNDR
[34]\t"S-0000000000000020"[2]\t\t# "MF0;spine-1:MQM9700/U1" lid 4 4xNDR

switchguid=0x20(20)
Switch\t64 "S-0000000000000020"\t\t# "MF0;spine-1:MQM9700/U1" enhanced port 0 lid 4 lmc 0
[1]\t"S-0000000000000010"[33]\t\t# "MF0;leaf-07:MQM9700/U1" lid 3 4xNDR
[2]\t"S-0000000000000010"[34]\t\t# "MF0;leaf-07:MQM9700/U1" lid 3 4xNDR

caguid=0x1
Ca\t2 "H-0000000000000001"\t\t# "gpu07 mlx5_0"
[1](2) \t"S-0000000000000010"[1]\t\t# lid 5 lmc 0 "MF0;leaf-07:MQM9700/U1" lid 3 4xNDR
[2](3) \t"S-0000000000000010"[2]\t\t# lid 6 lmc 0 "MF0;leaf-07:MQM9700/U1" lid 3 2xNDR
"""


def test_dual_port_hca_parallel_cables_and_nvidia_switch_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "ibnet.txt"
    source.write_text(DUAL)
    renames = tmp_path / "map"
    renames.write_text("gpu07 node-007\n")
    topology = imported(capsys, "--ibnetdiscover", str(source), "--map", str(renames))
    assert topology["nodes"] == [
        {
            "id": "node-007",
            "gpus": 8,
            "ports": [
                {"id": "mlx5_0:1", "leaf": "leaf-07", "gbps": 400.0},
                {"id": "mlx5_0:2", "leaf": "leaf-07", "gbps": 200.0},
            ],
        }
    ]
    assert topology["links"] == [
        {"id": "leaf-07~spine-1", "a": "leaf-07", "b": "spine-1", "gbps": 800.0}
    ]


def test_a_name_with_a_slash_must_be_mapped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = tmp_path / "ibnet.txt"
    source.write_text(DUAL.replace("MF0;leaf-07:MQM9700/U1", "leaf/07"))
    message = failed(capsys, "import", "--ibnetdiscover", str(source))
    assert message == "c4: error: 'leaf/07': '/' joins node and port in ids: rename it with --map"


def test_diff_names_switch_cables_speeds_and_tiers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def written(name: str, conf: str, *options: str) -> str:
        (tmp_path / f"{name}.conf").write_text(conf)
        out = str(tmp_path / f"{name}.json")
        assert main(["topology", "import", "--slurm-conf", f"{tmp_path}/{name}.conf", *options,
                     "--out", out]) == 0  # fmt: skip
        return out

    old = written(
        "old", "SwitchName=l1 Nodes=n1\nSwitchName=l2 Nodes=n2\nSwitchName=s Switches=l[1-2]\n"
    )
    new = written(
        "new",
        "SwitchName=l1 Nodes=n1\nSwitchName=l2 Nodes=n2\nSwitchName=s Switches=l1\n"
        "SwitchName=t Switches=l2\n",
        "--port-gbps", "100",
    )  # fmt: skip
    capsys.readouterr()
    assert main(["topology", "diff", old, new]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "speed n1/node:1: 200 -> 100 Gb/s",
        "speed n2/node:1: 200 -> 100 Gb/s",
        "new t: switch (tier 2)",
        "missing l2~s: switch cable",
        "new l2~t: switch cable",
    ]

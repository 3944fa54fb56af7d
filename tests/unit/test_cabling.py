"""A port LLDP finds on another leaf than the topology says is a ``miscabled`` finding (with
both leaves), through the detection engine; it resolves when the port is back on its leaf."""

from __future__ import annotations

import orjson

from schemas.codec import decode, encode
from schemas.messages import Diagnosis, NeighbourPort, Neighbours
from streams.core.engine import Engine
from streams.core.stage import NODE, StateKey
from topology.generate import Shape, generate

TOPOLOGY = generate(Shape(nodes=4, spines=1, nics=1))  # node-00N/mlx5_0:1 on leaf-0a, :2 on leaf-0b


def report(ts_s: int, **ports: str) -> Neighbours:
    return Neighbours(
        v=1,
        kind="neighbours",
        node="node-001",
        ts_ns=ts_s * 1_000_000_000,
        ports=tuple(
            NeighbourPort(port=port.replace("_1", ":1").replace("_2", ":2"), switch=switch)
            for port, switch in ports.items()
        ),
    )


def test_a_port_on_another_leaf_fires_once_and_resolves_when_back() -> None:
    engine = Engine(topology=TOPOLOGY)
    assert engine.process(report(1, mlx5_0_1="leaf-0a", mlx5_0_2="leaf-0b")) == []
    fired = engine.process(report(2, mlx5_0_1="leaf-0a", mlx5_0_2="leaf-1b"))
    assert len(fired) == 1
    finding = fired[0]
    assert (finding.state, finding.class_, finding.job) == ("firing", "miscabled", None)
    assert [(s.type, s.id) for s in finding.suspects] == [
        ("port", "node-001/mlx5_0:2"),
        ("switch", "leaf-1b"),
    ]
    assert finding.evidence == {
        "port": "node-001/mlx5_0:2",
        "expected_leaf": "leaf-0b",
        "found_leaf": "leaf-1b",
    }
    assert engine.process(report(3, mlx5_0_2="leaf-1b")) == []  # still there: no new finding
    assert [f.id for f in engine.open_findings()] == [finding.id]  # counted as open (metrics)
    resolved = engine.process(report(4, mlx5_0_2="leaf-0b"))
    assert [(d.id, d.state) for d in resolved] == [(finding.id, "resolved")]
    # The topology is never corrected from a report: the same move fires again.
    assert [d.state for d in engine.process(report(5, mlx5_0_2="leaf-1b"))] == ["firing"]


def test_moved_again_is_a_new_finding_naming_the_new_leaf() -> None:
    engine = Engine(topology=TOPOLOGY)
    first = engine.process(report(1, mlx5_0_1="leaf-1a"))
    moved = engine.process(report(2, mlx5_0_1="leaf-2a"))
    assert [(d.id, d.state) for d in moved][0] == (first[0].id, "resolved")
    assert moved[1].state == "firing" and moved[1].evidence["found_leaf"] == "leaf-2a"  # type: ignore[index]


def test_ports_the_topology_does_not_know_and_no_topology_are_left_alone() -> None:
    assert Engine(topology=TOPOLOGY).process(report(1, eth9_1="leaf-7a")) == []
    assert Engine().process(report(1, mlx5_0_1="leaf-7a")) == []


def test_the_finding_is_a_valid_v1_diagnosis() -> None:
    fired = Engine(topology=TOPOLOGY).process(report(1, mlx5_0_1="leaf-1a"))
    assert isinstance(decode(encode(fired[0]), "diagnosis"), Diagnosis)
    repeated = dict(report(1).model_dump(), ports=[{"port": "a", "switch": "s"}] * 2)
    rejected = decode(orjson.dumps(repeated), "neighbours")
    assert not isinstance(rejected, Neighbours)
    assert "listed twice" in rejected.reason  # type: ignore[union-attr]


def test_a_restarted_worker_keeps_the_finding_and_resolves_it_under_its_id() -> None:
    # The node's state (key NODE/node-001) goes into the snapshot and comes back: the same
    # report fires nothing new (one alert per fault), the port back on its leaf resolves
    # the finding the first worker fired.
    first = Engine(topology=TOPOLOGY)
    fired = first.on_message(report(1, mlx5_0_2="leaf-1b"))
    key = first.key_of(report(1))
    assert key == StateKey(NODE, "node-001") == first.key_of_finding(fired[0])
    assert key in first.keys(NODE)
    states = orjson.loads(orjson.dumps({"s": first.snapshot([key])[key]}))["s"]
    second = Engine(topology=TOPOLOGY)
    second.restore(key, states)
    assert [f.id for f in second.open_findings()] == [fired[0].id]
    assert second.on_message(report(2, mlx5_0_2="leaf-1b")) == []
    resolved = second.on_message(report(3, mlx5_0_2="leaf-0b"))
    assert [(d.id, d.state) for d in resolved] == [(fired[0].id, "resolved")]
    second.drop(key)
    assert second.keys(NODE) == [] and second.open_findings() == []

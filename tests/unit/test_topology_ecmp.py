from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology.ecmp import (
    HASH_MODELS,
    SPORT_MAX,
    SPORT_MIN,
    Ecmp,
    NoSourcePortError,
    UnknownHashError,
    choose_spine,
    format_ip,
    hash_model,
    port_ip,
    sport_for,
)
from topology.generate import Shape, generate
from topology.model import Fabric, UnreachableError


@cache
def fabric(spines: int) -> Fabric:
    return Fabric.from_topology(generate(Shape(nodes=24, spines=spines, nics=2)))


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(sorted(HASH_MODELS)),
    seed=st.integers(0, 2**32 - 1),
    spines=st.integers(1, 12),
    src=st.integers(0, 23),
    dst=st.integers(0, 23),
    nic=st.integers(0, 1),
    wanted=st.integers(0, 11),
    drop=st.integers(0, 11),
)
def test_sport_makes_the_hash_choose_the_planned_spine(
    model: str, seed: int, spines: int, src: int, dst: int, nic: int, wanted: int, drop: int
) -> None:
    fab, switch_hash = fabric(spines), hash_model(model, seed)
    a, b = f"node-{src:03d}/mlx5_{nic}:1", f"node-{dst:03d}/mlx5_0:1"
    if fab.ports[a].leaf == fab.ports[b].leaf:
        assert choose_spine(fab, switch_hash, a, b, SPORT_MIN) is None
        return
    target = f"spine-a-{wanted % spines}"
    # A down link on another spine shrinks the ECMP group; the search must use the new group.
    other = f"spine-a-{drop % spines}"
    down = [f"{fab.ports[a].leaf}~{other}"] if other != target else []
    sport = sport_for(fab, switch_hash, a, b, target, down)
    assert SPORT_MIN <= sport <= SPORT_MAX
    assert choose_spine(fab, switch_hash, a, b, sport, down) == target


@pytest.mark.parametrize("model", sorted(HASH_MODELS))
def test_hash_reaches_every_member_and_seeds_matter(model: str) -> None:
    fab = fabric(8)
    src, dst = fab.port_index["node-000/mlx5_0:1"], fab.port_index["node-009/mlx5_0:1"]
    ecmp = Ecmp(fab, hash_model(model))
    counts = Counter(ecmp.choose(src, dst, sport) for sport in range(SPORT_MIN, SPORT_MIN + 4096))
    assert len(counts) == 8
    assert min(counts.values()) > 4096 / 8 / 2
    reseeded = Ecmp(fab, hash_model(model, seed=7))
    outcomes = [ecmp.choose(src, dst, s) for s in range(SPORT_MIN, SPORT_MIN + 64)]
    assert outcomes != [reseeded.choose(src, dst, s) for s in range(SPORT_MIN, SPORT_MIN + 64)]


def test_hash_is_deterministic_and_per_switch() -> None:
    crc = hash_model("crc32")
    assert crc.hash("leaf-0a", 1, 2, 50000) == hash_model("crc32").hash("leaf-0a", 1, 2, 50000)
    hashes = {crc.hash(leaf, 1, 2, 50000) for leaf in ("leaf-0a", "leaf-1a", "leaf-2a")}
    assert len(hashes) == 3


def test_addresses_are_distinct_and_stable() -> None:
    fab = fabric(4)
    addresses = {port_ip(i) for i in range(len(fab.port_ids))}
    assert len(addresses) == len(fab.port_ids)
    assert format_ip(port_ip(0)) == "10.0.0.1"


def test_errors() -> None:
    fab = fabric(4)
    with pytest.raises(UnknownHashError, match="crc32, xor-fold, toeplitz"):
        hash_model("fnv")
    a, b = "node-000/mlx5_0:1", "node-009/mlx5_0:1"
    with pytest.raises(NoSourcePortError, match="not in the ECMP group"):
        sport_for(fab, hash_model("crc32"), a, b, "spine-a-1", ["leaf-0a~spine-a-1"])
    with pytest.raises(NoSourcePortError, match="unknown spine"):
        sport_for(fab, hash_model("crc32"), a, b, "spine-z")
    every = [f"leaf-0a~spine-a-{i}" for i in range(4)]
    with pytest.raises(UnreachableError, match="every path crosses a down link"):
        choose_spine(fab, hash_model("crc32"), a, b, SPORT_MIN, every)

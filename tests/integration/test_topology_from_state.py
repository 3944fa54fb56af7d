"""The detection worker's fabric from the cluster state (``--topology redis``): the topology
``c4 state load`` put in Redis, so the cabling check and the correlator reason about the
fabric the actions side plans on; none loaded, or a broken one, is one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from c4.cluster_state import topology_from_state
from c4.inputs import InputError
from c4.settings import load_settings
from tests.integration.fabric_tools import c4

pytestmark = pytest.mark.integration


@pytest.fixture
def prefix(redis_url: str, unique: str) -> Iterator[str]:
    name = f"test:{unique}"
    yield name
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{name}*", count=1000))
    if keys:
        client.delete(*keys)


def test_the_worker_reads_the_topology_state_load_put_in_redis(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    generated = c4("topology", "gen", "--nodes", "8", "--spines", "2", "--planes", "1")
    assert generated.returncode == 0, generated.stderr
    source = tmp_path / "topology.json"
    source.write_text(generated.stdout)
    env = {"C4_REDIS_URL": redis_url, "C4_REDIS_KEY_PREFIX": prefix}
    loaded = c4("state", "load", "--topology", str(source), env=env)
    assert loaded.returncode == 0, loaded.stderr
    settings = load_settings(redis_url=redis_url, redis_key_prefix=prefix)
    topology = topology_from_state(settings)
    ports = {f"{node.id}/{port.id}": port.leaf for node in topology.nodes for port in node.ports}
    assert len({node.id for node in topology.nodes}) == 8
    assert ports and all(leaf for leaf in ports.values())


def test_no_topology_loaded_or_a_broken_one_is_one_line(redis_url: str, prefix: str) -> None:
    settings = load_settings(redis_url=redis_url, redis_key_prefix=prefix)
    with pytest.raises(InputError, match=r"^redis key .*: no topology loaded \(c4 state load\)$"):
        topology_from_state(settings)
    redis.Redis.from_url(redis_url).set(f"{prefix}:topology", b'{"v": 1, "kind": "topology"')
    with pytest.raises(InputError, match=r"^redis key .*: invalid JSON") as error:
        topology_from_state(settings)
    assert "\n" not in str(error.value)

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from c4.inputs import InputError, load_document
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.files import Topology
from tests.contract import contract_examples


def test_files_larger_than_a_kafka_message_load(tmp_path: Path) -> None:
    # A large cluster's topology exceeds the 4 MiB message limit; files are not messages.
    topology = dict(contract_examples()["topology"], note="x" * (MAX_MESSAGE_BYTES + 1))
    topology["switches"] = [*topology["switches"], {"id": "leaf-0b", "tier": 1}]
    path = tmp_path / "big.json"
    path.write_bytes(orjson.dumps(topology))
    assert isinstance(load_document(str(path), "topology", Topology), Topology)


@pytest.mark.parametrize(
    ("content", "code", "text"),
    [
        (b"{nope", 1, "invalid JSON"),
        (b'{"v": 1, "kind": "flows", "flows": []}', 1, "kind: expected 'topology', got 'flows'"),
    ],
)
def test_bad_files_name_themselves(tmp_path: Path, content: bytes, code: int, text: str) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as caught:
        load_document(str(path), "topology", Topology)
    assert caught.value.exit_code == code
    assert str(caught.value).startswith(f"{path}: ") and text in str(caught.value)


def test_unreadable_file_exits_two(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load_document(str(tmp_path / "absent.json"), "topology", Topology)
    assert caught.value.exit_code == 2

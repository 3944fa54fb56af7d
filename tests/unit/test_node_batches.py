"""``links`` and ``gpus`` batches: a node's reports of one interval, taken apart message by
message, the fast path and the models agreeing."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import RejectCode, encode
from schemas.fastpath import decode_hot_batch
from schemas.messages import Gpu, Gpus, Link, Links
from schemas.records import Rejected, batch_kinds, decode_record
from streams.core.engine import Engine
from streams.core.params import DetectorParams
from streams.core.stage import NODE, StateKey, state_key
from tests.contract import contract_examples
from tests.unit.test_batches import assert_agree
from tests.unit.test_codec_properties import links
from tests.unit.test_fastpath import mutated, near_misses_of


@st.composite
def link_batches(draw: st.DrawFn) -> dict[str, Any]:
    """A valid links batch: 0 to 6 link messages of one node."""
    node = draw(st.sampled_from(["node-001", "n", "x" * 256]))
    elements = draw(st.lists(links(), max_size=6))
    for element in elements:
        element["node"] = node
    return {"v": 1, "kind": "links", "node": node, "ts_ns": 5, "messages": elements}


@settings(max_examples=300)
@given(link_batches())
def test_a_valid_links_batch_gives_its_messages_in_order(batch: dict[str, Any]) -> None:
    found = assert_agree(batch, "link")
    assert_agree(batch, None)
    if batch["messages"]:
        assert decode_hot_batch(orjson.dumps(batch), "link") is not None  # the fast way
    assert [kind for kind, _ in found] == ["ok"] * len(batch["messages"])
    for (_, (model, wire)), element in zip(found, batch["messages"], strict=True):
        assert isinstance(model, Link)
        assert wire == encode(Link.model_validate(element))
    whole = Links.model_validate(batch)  # the batch model agrees: all valid
    assert [m for _, (m, _) in found] == list(whole.messages)


@settings(max_examples=600)
@given(st.data())
def test_a_broken_links_batch_is_judged_alike_with_and_without_the_fast_path(
    data: st.DataObject,
) -> None:
    batch = mutated(data.draw, data.draw(link_batches()), ["extra"])
    found = assert_agree(batch, "link")
    assert_agree(batch, None)
    elements = batch.get("messages") if isinstance(batch, dict) else None
    if isinstance(elements, list) and len(found) == len(elements) and found:
        for kind, (model, _) in found:
            if kind == "ok":  # taken apart: each valid element is of the batch's node
                assert model.node == batch["node"]


def test_an_element_of_another_node_is_rejected_alone() -> None:
    batch = contract_examples()["links"]
    stray = dict(batch["messages"][1], node="node-002")
    record = orjson.dumps(batch | {"messages": [batch["messages"][0], stray]})
    first, second = decode_record(record, "link")
    assert isinstance(first, Link) and first.port == "mlx5_0:1"
    assert isinstance(second, Rejected)
    assert second.rejection.code == RejectCode.INCONSISTENT
    assert second.reason == "messages[1].node: 'node-002' is not the batch's node 'node-001'"
    assert orjson.loads(second.payload) == stray


@pytest.mark.parametrize("kind", ["links", "gpus"])
def test_a_broken_envelope_rejects_the_whole_record(kind: str) -> None:
    batch = contract_examples()[kind]
    (rejected,) = decode_record(orjson.dumps({k: v for k, v in batch.items() if k != "node"}))
    assert isinstance(rejected, Rejected) and rejected.reason == "node: required field missing"
    (rejected,) = decode_record(orjson.dumps(batch | {"messages": {"a": 1}}))
    assert isinstance(rejected, Rejected) and rejected.reason.startswith("messages:")


def test_a_gpus_batch_gives_its_messages_and_rejects_a_bad_one_alone() -> None:
    batch = contract_examples()["gpus"]
    bad = dict(batch["messages"][1], gpu=-1)
    found = decode_record(orjson.dumps(batch | {"messages": [batch["messages"][0], bad]}), "gpu")
    assert isinstance(found[0], Gpu) and found[0] == Gpu.model_validate(batch["messages"][0])
    assert isinstance(found[1], Rejected) and found[1].reason.startswith("messages[1].gpu:")
    assert decode_record(orjson.dumps(batch | {"messages": []}), "gpu") == []  # means nothing


def test_what_each_reader_kind_takes() -> None:
    assert batch_kinds("link") == {"links"} and batch_kinds("gpu") == {"gpus"}
    assert batch_kinds("neighbours") == set() and batch_kinds("job") == set()
    assert batch_kinds(None) == {"collectives", "links", "gpus"}
    links_record = orjson.dumps(contract_examples()["links"])
    gpus_record = orjson.dumps(contract_examples()["gpus"])
    assert [type(m) for m in decode_record(links_record, "link")] == [Link, Link]
    assert [type(m) for m in decode_record(gpus_record, "gpu")] == [Gpu, Gpu]
    for record, reader in ((links_record, "gpu"), (gpus_record, "link"), (links_record, "job")):
        (rejected,) = decode_record(record, reader)
        assert isinstance(rejected, Rejected)
        assert rejected.reason.startswith(f"kind: expected '{reader}'")
    (single,) = decode_record(orjson.dumps(contract_examples()["link"]), "links")
    assert isinstance(single, Rejected)  # a batch reader takes batches only


@pytest.mark.parametrize("kind", ["links", "gpus"])
def test_near_misses_in_every_place_of_the_example_batch(kind: str) -> None:
    for obj in near_misses_of(contract_examples()[kind]):
        assert_agree(obj, kind[:-1])


def test_the_engine_takes_a_node_batch_model_as_its_messages() -> None:
    links_batch = Links.model_validate(contract_examples()["links"])
    gpus_batch = Gpus.model_validate(contract_examples()["gpus"])
    one, other = Engine(DetectorParams()), Engine(DetectorParams())
    one.process(links_batch)
    one.process(gpus_batch)
    for message in (*links_batch.messages, *gpus_batch.messages):
        other.process(message)
    assert one.counts == other.counts == {"Link": 2, "Gpu": 2}
    assert state_key(links_batch) == state_key(gpus_batch) == StateKey(NODE, "node-001")

"""``collectives`` batches: taken apart message by message, fast path and models agreeing."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schemas.records
from schemas.base import C4Model
from schemas.codec import RejectCode, encode
from schemas.fastpath import decode_hot_batch
from schemas.messages import Collective, Collectives
from schemas.records import Rejected, decode_record
from streams.core.engine import Engine
from streams.core.params import DetectorParams
from tests.contract import contract_examples
from tests.unit.test_codec_properties import collectives
from tests.unit.test_fastpath import mutated, near_misses_of, pairs

Outcome = tuple[str, Any]


def slow_record(raw: bytes, kind: str | None) -> list[Outcome]:
    """What the models alone say of a record (the fast path switched off)."""
    with patch.object(schemas.records, "decode_hot_batch", lambda *_: None):
        return outcomes(decode_record(raw, kind))


def outcomes(results: list[C4Model | Rejected]) -> list[Outcome]:
    return [
        ("rejected", (r.rejection, r.payload))
        if isinstance(r, Rejected)
        else ("ok", (r, encode(r)))
        for r in results
    ]


def assert_agree(obj: Any, kind: str | None = None) -> list[Any]:
    raw = orjson.dumps(obj)
    fast = outcomes(decode_record(raw, kind))
    assert fast == slow_record(raw, kind)
    return fast


@st.composite
def batches(draw: st.DrawFn) -> dict[str, Any]:
    """A valid batch: 0 to 6 collective messages of one job."""
    job = draw(st.sampled_from(["job-1", "j", "x" * 256]))
    elements = draw(st.lists(st.one_of(collectives(), pairs()), max_size=6))
    for element in elements:
        element["job"] = job
    batch: dict[str, Any] = {"v": 1, "kind": "collectives", "job": job, "ts_ns": 5}
    if draw(st.booleans()):
        batch["node"] = "node-001"
    batch["messages"] = elements
    return batch


@st.composite
def broken_batches(draw: st.DrawFn) -> dict[str, Any]:
    """A valid batch with one to three places replaced, removed or added."""
    batch: dict[str, Any] = mutated(draw, draw(batches()), ["extra"])
    return batch


@settings(max_examples=300)
@given(batches())
def test_a_valid_batch_gives_its_messages_in_order(
    batch: dict[str, Any],
) -> None:
    found = assert_agree(batch, "collective")
    if not batch["messages"]:
        # Empty: a node's presence (its envelope) when it names the node, else nothing.
        assert [type(m) for _, (m, _) in found] == ([Collectives] if "node" in batch else [])
        return
    assert decode_hot_batch(orjson.dumps(batch), "collective") is not None  # the fast way
    assert [kind for kind, _ in found] == ["ok"] * len(batch["messages"])
    for (_, (model, wire)), element in zip(found, batch["messages"], strict=True):
        assert isinstance(model, Collective)
        assert wire == encode(Collective.model_validate(element))
    whole = Collectives.model_validate(batch)  # the batch model agrees: all valid
    assert [m for _, (m, _) in found] == list(whole.messages)


@settings(max_examples=600)
@given(broken_batches())
def test_a_broken_batch_is_judged_alike_with_and_without_the_fast_path(
    batch: dict[str, Any],
) -> None:
    found = assert_agree(batch, "collective")
    assert_agree(batch, None)
    valid = [model for kind, (model, _) in found if kind == "ok"]
    elements = batch.get("messages")
    if elements == [] and valid:
        assert [type(m) for m in valid] == [Collectives] and valid[0].node is not None
    elif isinstance(elements, list) and len(found) == len(elements):
        # Taken apart: each valid element is exactly the one alone would be.
        for kind, (model, _) in found:
            if kind == "ok":
                assert model.job == batch["job"]
    else:
        assert len(found) == 1 and found[0][0] == "rejected" and not valid


def test_one_bad_message_is_rejected_alone_with_its_path_and_payload() -> None:
    single = contract_examples()["collective"]
    batch = dict(contract_examples()["collectives"])
    batch["messages"] = [single, dict(single, rank=20), dict(single, job="job-7"), 5, single]
    results = decode_record(orjson.dumps(batch), "collective")
    assert [type(r).__name__ for r in results] == [
        "Collective",
        "Rejected",
        "Rejected",
        "Rejected",
        "Collective",
    ]
    rank, job, number = (r for r in results if isinstance(r, Rejected))
    assert rank.reason == "messages[1].rank: 20 >= comm_size 16"
    assert rank.rejection.code is RejectCode.INCONSISTENT
    assert orjson.loads(rank.payload) == dict(single, rank=20)
    assert job.reason == "messages[2].job: 'job-7' is not the batch's job 'job-42'"
    assert number.reason == "messages[3]: expected a JSON object, got integer 5"
    assert number.payload == b"5"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"job": None}, "job: should be a valid string, got null"),
        ({"ts_ns": -1}, "ts_ns: should be greater than or equal to 0, got -1"),
        ({"messages": "no"}, "messages: should be a valid tuple, got string 'no'"),
        ({"v": 2}, "v: unsupported version 2, expected 1"),
    ],
)
def test_a_broken_envelope_rejects_the_whole_record(change: dict[str, Any], reason: str) -> None:
    batch = contract_examples()["collectives"] | change
    raw = orjson.dumps(batch)
    (result,) = decode_record(raw, "collective")
    assert isinstance(result, Rejected)
    assert result.reason == reason
    assert result.payload == raw


def test_a_missing_messages_array_and_a_too_long_one_reject_the_record() -> None:
    batch = dict(contract_examples()["collectives"])
    del batch["messages"]
    (missing,) = decode_record(orjson.dumps(batch))
    assert isinstance(missing, Rejected) and missing.reason == "messages: required field missing"
    element = contract_examples()["collective"]
    too_long = dict(batch, messages=[element] * 4097)
    (long,) = decode_record(orjson.dumps(too_long))
    assert isinstance(long, Rejected)
    assert long.reason.startswith("messages: should have at most 4096 items")


def test_what_each_reader_kind_takes() -> None:
    batch = orjson.dumps(contract_examples()["collectives"])
    single = orjson.dumps(contract_examples()["collective"])
    assert len(decode_record(batch, "collective")) == 2
    assert len(decode_record(batch, "collectives")) == 2
    (only,) = decode_record(single, "collectives")
    assert isinstance(only, Rejected) and only.reason.startswith("kind: expected 'collectives'")
    (link,) = decode_record(batch, "link")
    assert isinstance(link, Rejected) and link.reason.startswith("kind: expected 'link'")
    (job,) = decode_record(batch, "job")
    assert isinstance(job, Rejected) and job.reason.startswith("kind: expected 'job'")


def test_near_misses_in_every_place_of_the_example_batch() -> None:
    for obj in near_misses_of(contract_examples()["collectives"]):
        assert_agree(obj, "collective")


def test_the_engine_takes_a_batch_model_as_its_messages() -> None:
    batch = Collectives.model_validate(contract_examples()["collectives"])
    one, other = Engine(DetectorParams()), Engine(DetectorParams())
    one.process(batch)
    for message in batch.messages:
        other.process(message)
    assert one.counts == other.counts == {"Collective": 2}

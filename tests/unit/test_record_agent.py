"""The streams worker's agents hand a record's messages over at once: every valid message
in order, one dead letter per message that decoding or detection failed on, the rest kept."""

from __future__ import annotations

import asyncio

import orjson

from schemas.base import C4Model
from schemas.codec import Rejection, decode
from schemas.messages import Deadletter, Link
from streams.intake_app import record_agent
from tests.contract import contract_examples
from tests.unit.test_fuzz_streams import Event, Stream, Topic


def links_record(*ports: str, bad_at: int | None = None) -> bytes:
    batch = contract_examples()["links"]
    element = batch["messages"][0]
    messages = [dict(element, port=port) for port in ports]
    if bad_at is not None:
        messages[bad_at]["ts_ns"] = -1  # an impossible value: rejected alone
    return orjson.dumps(batch | {"messages": messages})


def run(events: list[Event], fail_port: str | None = None) -> tuple[list[list[str]], Topic]:
    seen: list[list[str]] = []
    letters = Topic()
    rejected: list[Rejection] = []

    async def handler(key: str | None, messages: list[C4Model]) -> list[tuple[int, Exception]]:
        ports = [m.port for m in messages if isinstance(m, Link)]
        seen.append(ports)
        failing = ValueError("detection failed on this one")
        return [(index, failing) for index, port in enumerate(ports) if port == fail_port]

    agent = record_agent("in.link", "link", handler, letters, lambda _, r: rejected.append(r))
    asyncio.run(agent(Stream(events)))  # type: ignore[arg-type]
    assert len(rejected) == len(letters.sent)
    return seen, letters


def test_each_record_comes_whole_and_in_order() -> None:
    events = [
        Event(b"node-001", links_record("mlx5_0:1", "mlx5_1:1")),
        Event(b"node-001", orjson.dumps(contract_examples()["link"])),
        Event(b"node-001", links_record("mlx5_2:1", "mlx5_3:1", "mlx5_4:1")),
    ]
    seen, letters = run(events)
    single = contract_examples()["link"]["port"]
    assert seen == [["mlx5_0:1", "mlx5_1:1"], [single], ["mlx5_2:1", "mlx5_3:1", "mlx5_4:1"]]
    assert letters.sent == []


def test_an_invalid_element_and_a_failed_message_are_dead_lettered_alone() -> None:
    events = [
        Event(b"node-001", links_record("mlx5_0:1", "mlx5_1:1", "mlx5_2:1", bad_at=1)),
        Event(b"node-001", b"{not json"),
        Event(b"node-001", links_record("mlx5_5:1", "mlx5_6:1")),
    ]
    seen, letters = run(events, fail_port="mlx5_6:1")
    assert seen == [["mlx5_0:1", "mlx5_2:1"], ["mlx5_5:1", "mlx5_6:1"]]
    reasons = []
    for key, value in letters.sent:
        letter = decode(value, "deadletter")
        assert isinstance(letter, Deadletter) and key == b"node-001"
        payload = letter.payload
        port = orjson.loads(payload).get("port", "") if payload.startswith('{"') else ""
        reasons.append((letter.error, port))
    assert reasons[0][0].startswith("messages[1].ts_ns:") and reasons[0][1] == "mlx5_1:1"
    assert reasons[1][1] == ""  # the record that is no JSON, whole
    assert reasons[2] == ("ValueError: detection failed on this one", "mlx5_6:1")
    assert len(reasons) == 3

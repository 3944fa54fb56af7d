"""Good records around bad ones: both consumers of v1 topics keep going and lose nothing.

A random interleaving of valid messages and hostile records (garbage bytes, truncated or
mutated messages, the wrong kind, NaN literals, huge arrays) goes through the streams
worker's decoding step (`streams.intake.decoded`, what every Faust agent runs) and through
the action worker's consume loop (`actions.worker.ActionWorker`, with its Kafka transport,
Redis state and pipeline replaced by recorders). Every valid message comes out, in order;
every bad record becomes exactly one dead letter carrying its reason and original bytes; the
action worker commits past every record, bad ones included.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actions.metrics import ActionMetrics
from actions.pipeline.pipeline import Handled
from actions.worker import ActionWorker, Topics
from schemas.base import C4Model
from schemas.codec import MAX_DEADLETTER_PAYLOAD, Rejection, decode
from schemas.messages import Deadletter, Diagnosis, Job
from streams.intake import decoded
from tests.contract import contract_examples
from tests.hostile import VALUES, damaged, json_text

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def good(kind: str, index: int) -> bytes:
    message = dict(contract_examples()[kind])
    if kind == "diagnosis":
        message["id"] = f"d-{index}"
    elif kind == "job":
        message["job"] = f"job-{index}"
    else:
        message["ts_ns"] = message["ts_ns"] + index
    return orjson.dumps(message)


def hostile(kind: str) -> st.SearchStrategy[bytes]:
    example = contract_examples()[kind]
    other = "link" if kind != "link" else "gpu"
    return st.one_of(
        st.binary(max_size=120),
        damaged(orjson.dumps(example)),
        VALUES.map(lambda value: json_text(value).encode("utf-8", "surrogatepass")),
        st.builds(
            lambda field, value: json_text({**example, field: value}).encode(
                "utf-8", "surrogatepass"
            ),
            st.sampled_from(sorted(example)),
            VALUES,
        ),
        st.just(orjson.dumps(contract_examples()[other])),
    )


@st.composite
def streams_of(draw: st.DrawFn, kinds: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """(kind, bytes) records: good ones numbered in order, bad ones in between."""
    records: list[tuple[str, bytes]] = []
    for index in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(kinds))
        if draw(st.booleans()):
            records.append((kind, draw(hostile(kind))))
        records.append((kind, good(kind, index)))
    return records


# --- the streams worker's decoding step --------------------------------------------------


@dataclass
class Event:
    key: bytes | None
    value: bytes


@dataclass
class Stream:
    records: list[Event]

    async def events(self) -> AsyncIterator[Event]:
        for record in self.records:
            yield record


def assert_payload_kept(payload: str, raw: bytes) -> None:
    """The dead letter holds the original bytes; an oversized message's only their start."""
    original = raw.decode("utf-8", "backslashreplace")
    if len(original) <= MAX_DEADLETTER_PAYLOAD:
        assert payload == original
    else:
        assert payload.startswith(original[:MAX_DEADLETTER_PAYLOAD])
        assert payload.endswith(f"[cut: {len(original)} characters in all]")


@dataclass
class Topic:
    sent: list[tuple[bytes, bytes]] = field(default_factory=list)

    async def send(self, key: bytes, value: bytes) -> None:
        self.sent.append((key, value))


@FUZZ
@given(st.sampled_from(["collective", "link", "gpu", "job"]).flatmap(lambda k: streams_of((k,))))
def test_streams_decoding_passes_good_records_and_dead_letters_bad_ones(
    records: list[tuple[str, bytes]],
) -> None:
    kind = records[0][0]
    events = [Event(f"k{i}".encode(), raw) for i, (_, raw) in enumerate(records)]
    letters = Topic()
    rejected: list[Rejection] = []

    async def collect() -> list[tuple[str | None, C4Model, bytes | None]]:
        stream = decoded(Stream(events), "in.topic", kind, letters, lambda _, r: rejected.append(r))
        return [item async for item in stream]

    out = asyncio.run(collect())
    expected = [(e, decode(e.value, kind)) for e in events]
    wanted = [(e.key.decode(), m) for e, m in expected if not isinstance(m, Rejection)]
    assert [(key, model) for key, model, _ in out] == wanted
    bad = [(e, m) for e, m in expected if isinstance(m, Rejection)]
    assert len(letters.sent) == len(bad) == len(rejected)
    for (key, value), (event, rejection) in zip(letters.sent, bad, strict=True):
        letter = decode(value, "deadletter")
        assert isinstance(letter, Deadletter), letter
        assert key == event.key
        assert letter.topic == "in.topic" and letter.error == rejection.reason
        assert_payload_kept(letter.payload, event.value)


# --- the action worker's consume loop ----------------------------------------------------


@dataclass
class Record:
    topic_name: str
    raw: bytes
    raw_key: bytes

    def topic(self) -> str:
        return self.topic_name

    def value(self) -> bytes:
        return self.raw

    def key(self) -> bytes:
        return self.raw_key

    def partition(self) -> int:
        return 0  # one partition: this worker owns every alert it sends


class Transport:
    """The worker's Kafka side: hands out the records, then stops the worker."""

    def __init__(self, records: list[Record], stop: threading.Event) -> None:
        self.records = list(records)
        self.stop = stop
        self.published: list[tuple[C4Model, str | None]] = []
        self.committed: list[Record] = []

    def poll(self, timeout_s: float) -> Record | None:
        if not self.records:
            self.stop.set()
            return None
        return self.records.pop(0)

    def publish(self, message: C4Model, key: str | None = None) -> None:
        self.published.append((message, key))

    def flush(self) -> None:
        pass

    def commit(self, record: Record) -> bool:
        self.committed.append(record)
        return True


class State:
    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def record(self, job: Job) -> bool:
        self.jobs.append(job)
        return True


class Pipeline:
    def __init__(self) -> None:
        self.handled: list[Diagnosis] = []

    def handle(self, diagnosis: Diagnosis, partition: int = 0) -> Handled:
        self.handled.append(diagnosis)
        return Handled(records=())

    def finish(self, handled: Handled) -> bool:
        return True


@FUZZ
@given(streams_of(("diagnosis", "job")))
def test_action_worker_acts_on_good_records_and_dead_letters_bad_ones(
    records: list[tuple[str, bytes]],
) -> None:
    topics = Topics.with_prefix("t.")
    topic_of = {"diagnosis": topics.diagnosis, "job": topics.job}
    stream = [
        Record(topic_of[kind], raw, f"k{i}".encode()) for i, (kind, raw) in enumerate(records)
    ]
    stop = threading.Event()
    transport, state, pipeline = Transport(stream, stop), State(), Pipeline()
    metrics = ActionMetrics()
    worker = ActionWorker(transport, state, pipeline, topics, metrics, stop)  # type: ignore[arg-type]
    worker.run()
    assert transport.committed == stream
    results = [
        (record, decode(record.raw, kind))
        for record, (kind, _) in zip(stream, records, strict=True)
    ]
    assert pipeline.handled == [m for _, m in results if isinstance(m, Diagnosis)]
    assert state.jobs == [m for _, m in results if isinstance(m, Job)]
    bad = [(record, m) for record, m in results if isinstance(m, Rejection)]
    letters = [(m, key) for m, key in transport.published if isinstance(m, Deadletter)]
    assert len(letters) == len(bad) == len(transport.published)
    for (letter, key), (record, rejection) in zip(letters, bad, strict=True):
        assert key == record.raw_key.decode()
        assert letter.topic == record.topic_name and letter.error == rejection.reason
        assert_payload_kept(letter.payload, record.raw)

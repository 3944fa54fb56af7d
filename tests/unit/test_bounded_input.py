"""Every reader of untrusted bytes is bounded: depth, line length, binary data, file size."""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from c4.dashboard.server import RequestLog
from c4.inputs import InputError, json_lines, load_document, read_input
from c4.stack import ComponentStatus
from c4.stack import status_exit_code as stack_exit_code
from schemas.codec import MAX_DEPTH, RejectCode, Rejection, decode, nested_deeper_than
from schemas.files import Topology
from schemas.records import Rejected, decode_record
from streams.core.params import ParamsError, params_from_document
from streams.intake import decoded


def deep_object(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def deep_array(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 500, 1000, 1023, 1100, 20_000])
@pytest.mark.parametrize("kind", [None, "collective", "link", "job", "collectives"])
def test_a_deep_document_is_rejected_as_too_deep_on_every_path(
    levels: int, kind: str | None
) -> None:
    for document in (deep_object(levels), deep_array(levels)):
        results = decode_record(document, kind)
        assert len(results) == 1
        rejected = results[0]
        assert isinstance(rejected, Rejected)
        if document.startswith(b"["):
            # An array is no v1 document whatever its depth, unless orjson refuses it first.
            assert rejected.rejection.code in (RejectCode.NOT_AN_OBJECT, RejectCode.TOO_DEEP)
        else:
            assert rejected.rejection.code is RejectCode.TOO_DEEP
        single = decode(document, kind)
        assert isinstance(single, Rejection)


def test_a_deep_element_of_a_batch_is_rejected_alone() -> None:
    good = (
        b'{"v":1,"kind":"collective","job":"j","comm":"c","comm_size":2,"rank":0,'
        b'"global_rank":0,"ts_ns":5,"ops":{"seq":[1],"op":["allreduce"],"bytes":[8],"enter_ns":[1],'
        b'"end_ns":[2]}}'
    )
    deep = deep_object(200)
    envelope = b'{"v":1,"kind":"collectives","job":"j","ts_ns":5,"messages":['
    batch = envelope + good + b"," + deep + b"]}"
    results = decode_record(batch, "collective")
    assert len(results) == 2
    assert not isinstance(results[0], Rejected)
    assert isinstance(results[1], Rejected)
    assert results[1].rejection.code is RejectCode.TOO_DEEP
    assert results[1].rejection.path == "messages[1]"


def test_depth_is_counted_without_recursion() -> None:
    value: Any = 1
    for _ in range(100_000):  # far past the interpreter's recursion limit
        value = [value]
    assert nested_deeper_than(value, MAX_DEPTH)
    assert not nested_deeper_than({"a": [{"b": [1, 2]}]}, 4)
    assert nested_deeper_than({"a": [{"b": [1, 2]}]}, 3)
    assert not nested_deeper_than("text", 1)


def lines_of(data: bytes, limit: int, chunk: int) -> list[tuple[int, bytes | None]]:
    class Chunked(io.RawIOBase):
        def __init__(self) -> None:
            self.at = 0

        def readable(self) -> bool:
            return True

        def read1(self, size: int = -1) -> bytes:
            part = data[self.at : self.at + min(size, chunk)]
            self.at += len(part)
            return part

    return list(json_lines(Chunked(), "test", limit))  # type: ignore[arg-type]


@given(
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\0", b""))),
    st.integers(1, 64),
    st.integers(1, 30),
)
def test_lines_are_the_split_lines_and_long_ones_come_as_none(
    lines: list[bytes], chunk: int, limit: int
) -> None:
    data = b"\n".join(lines)
    got = lines_of(data, limit, chunk)
    expected = [
        (number, None if len(line) > limit else line)
        for number, line in enumerate(data.split(b"\n"), start=1)
    ]
    if data.endswith(b"\n") or not data:
        expected = expected[:-1]  # the split's empty piece after the last newline
    assert got == expected


def test_a_line_far_over_the_limit_is_skipped_without_being_held(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as out:
        out.write(b'{"v":1,"x":"')
        for _ in range(64):
            out.write(b"a" * (1 << 20))
        out.write(b'"}\n{"second":1}\n')
    with path.open("rb") as stream:
        got = list(json_lines(stream, str(path)))
    assert got == [(1, None), (2, b'{"second":1}')]


def test_binary_input_ends_the_reading_with_one_line() -> None:
    with open("/dev/zero", "rb") as stream, pytest.raises(InputError) as raised:
        list(json_lines(stream, "/dev/zero"))
    assert str(raised.value) == "/dev/zero: binary data (a NUL byte), not JSON text"
    with pytest.raises(InputError, match="binary data"):
        read_input("/dev/zero")


def test_a_document_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "topology.json"
    path.write_bytes(b" " * 2048 + b"{}")
    with pytest.raises(InputError, match="larger than 1024 bytes"):
        read_input(str(path), limit=1024)
    assert read_input(str(path)) == b" " * 2048 + b"{}"


def test_a_deep_topology_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "topology.json"
    path.write_bytes(deep_object(900))
    with pytest.raises(InputError, match=r"topology.json: nested deeper than 32 levels"):
        load_document(str(path), "topology", Topology)


def test_a_misspelt_section_of_a_parameters_file_is_an_error() -> None:
    with pytest.raises(ParamsError, match="unknown key 'defautls'"):
        params_from_document({"defautls": {"hang_factor": 3}})
    params, jobs = params_from_document({"defaults": {"hang_factor": 3}, "jobs": {}})
    assert params.hang_factor == 3
    assert jobs == {}


def status(name: str, state: str) -> ComponentStatus:
    return ComponentStatus(name, state, None, "127.0.0.1:1", "")  # type: ignore[arg-type]


def test_stack_status_exit_code_says_running_stale_or_stopped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    running = [status("kafka", "running"), status("redis", "running")]
    assert stack_exit_code(running) == 0
    assert stack_exit_code([status("kafka", "stopped"), status("redis", "stopped")]) == 3
    assert stack_exit_code([status("kafka", "stale"), status("redis", "running")]) == 1
    assert capsys.readouterr().err == (
        "c4 stack status: error: kafka stale (see the detail above)\n"
    )
    assert stack_exit_code([*running, status("slurmctld", "foreign")]) == 1


def test_a_request_the_server_cannot_parse_is_logged_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aiohttp.http_exceptions import LineTooLong

    request_log = RequestLog(logging.getLogger("test.dashboard"), {})
    with caplog.at_level(logging.WARNING, logger="test.dashboard"):
        request_log.exception(
            "Error handling request from %s", "127.0.0.1", exc_info=LineTooLong("x" * 9000, 8190)
        )
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert record.getMessage().startswith("Error handling request from 127.0.0.1: 400 LineTooLong")
    assert "\n" not in record.getMessage()


class Event:
    def __init__(self, value: bytes) -> None:
        self.key, self.value = b"job-1", value


class Stream:
    def __init__(self, values: list[bytes]) -> None:
        self._values = values

    async def events(self) -> Any:
        for value in self._values:
            yield Event(value)


class Letters:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, key: bytes, value: bytes) -> None:
        del key
        self.sent.append(value)


def test_a_record_the_codec_fails_on_is_a_dead_letter_and_the_next_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streams.intake as intake

    real = intake.decode_record

    def failing(raw: bytes, kind: str | None = None) -> list[Any]:
        if raw == b"boom":
            error = "a codec bug"
            raise RecursionError(error)
        return real(raw, kind)

    monkeypatch.setattr(intake, "decode_record", failing)
    good = (
        b'{"v":1,"kind":"link","node":"n","ts_ns":5,"port":"mlx5_0:1","state":"up",'
        b'"gbps":400,"counters":{"tx_bytes":1,"rx_bytes":1}}'
    )
    letters = Letters()
    reasons: list[str] = []
    stream = Stream([deep_object(1000), b"boom", good])

    async def take() -> list[Any]:
        return [
            message
            async for _, message, _ in decoded(
                stream, "t", "link", letters, lambda _t, r: reasons.append(r.reason)
            )
        ]

    got = asyncio.run(take())
    assert len(got) == 1
    assert reasons == ["nested deeper than 32 levels", "RecursionError: a codec bug"]
    assert len(letters.sent) == 2

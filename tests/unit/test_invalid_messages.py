from __future__ import annotations

import pytest

from schemas.codec import MAX_MESSAGE_BYTES, RejectCode, Rejection, decode
from tests.invalid_cases import Case, invalid_cases


def test_table_is_large() -> None:
    assert len(invalid_cases()) >= 40


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda case: case.name)
def test_rejected_with_reason(case: Case) -> None:
    result = decode(case.data)
    assert isinstance(result, Rejection), f"accepted: {result!r}"
    assert result.code is case.code, result.reason
    assert case.reason in result.reason
    assert "\n" not in result.reason


def test_expected_kind_mismatch() -> None:
    result = decode(b'{"v": 1, "kind": "link"}', kind="collective")
    assert isinstance(result, Rejection)
    assert result.code is RejectCode.WRONG_KIND
    assert result.reason == "kind: expected 'collective', got 'link'"


def test_oversized_message_rejected_before_parsing() -> None:
    result = decode(b" " * (MAX_MESSAGE_BYTES + 1))
    assert isinstance(result, Rejection)
    assert result.code is RejectCode.TOO_LARGE


def test_integer_beyond_64_bits_rejected() -> None:
    # orjson reads an integer beyond 64 bits as a float: a time must be an integer.
    huge = b'{"v": 1, "kind": "gpu", "node": "n", "gpu": 1, "xid": [], "ts_ns": 1' + b"0" * 30
    result = decode(huge + b"}")
    assert isinstance(result, Rejection)
    assert result.code is RejectCode.WRONG_TYPE
    assert result.reason.startswith("ts_ns: should be a valid integer")


def test_several_errors_counted() -> None:
    result = decode(b'{"v": 1, "kind": "gpu"}')
    assert isinstance(result, Rejection)
    assert result.code is RejectCode.MISSING_FIELD
    assert "more)" in result.reason

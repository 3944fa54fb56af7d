"""Structured logs of the streams worker: one JSON object per line."""

from __future__ import annotations

import logging
import logging.config
import sys

import orjson

from streams.logs import JsonFormatter, json_logging_config


def test_a_record_is_one_json_line_with_its_exception() -> None:
    try:
        message = "bad record"
        raise ValueError(message)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "c4.test", logging.WARNING, __file__, 1, "rejected %s", ("job-7",), exc_info
    )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = orjson.loads(line)
    assert entry["level"] == "warning"
    assert entry["logger"] == "c4.test"
    assert entry["msg"] == "rejected job-7"
    assert "ValueError: bad record" in entry["exc"]
    assert entry["ts"].endswith("+00:00")


def test_the_logging_config_is_accepted_by_dict_config() -> None:
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        logging.config.dictConfig(json_logging_config("warn"))
        assert isinstance(root.handlers[-1].formatter, JsonFormatter)
        assert root.level == logging.WARNING
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])

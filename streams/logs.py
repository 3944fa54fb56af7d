"""Structured logs: one JSON object per line (time, level, logger, message, exception)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import orjson


class JsonFormatter(logging.Formatter):
    """A log record as one JSON line, for log shippers (Loki, Elasticsearch, CloudWatch)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def json_logging_config(level: str) -> dict[str, object]:
    """A logging.dictConfig that writes JSON lines to stderr at ``level``."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "streams.logs.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
    }

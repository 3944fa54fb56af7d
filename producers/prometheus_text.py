"""A strict parser of the Prometheus text exposition format (0.0.4) and OpenMetrics' common part.

What it takes: ``# HELP name text`` (escapes ``\\\\`` and ``\\n``), ``# TYPE name type``,
other ``#`` comments (ignored), OpenMetrics' ``# UNIT`` and ``# EOF``, and samples
``name{label="value",...} value [timestamp]``: label values with the escapes ``\\\\``,
``\\"`` and ``\\n`` only, whitespace between the tokens, a trailing comma in the label set,
values as Go's ParseFloat writes them (``NaN``, ``+Inf``, ``-Inf``, ``1e+06``), an integer
timestamp in milliseconds (OpenMetrics: seconds, maybe fractional) and, in OpenMetrics, an
exemplar after ``#`` (skipped).

Every line is parsed on its own: a malformed one (a bad name, an unknown escape, an
unterminated label value, a duplicate label or series, trailing garbage) becomes one problem,
``line N: reason``, and is skipped; the lines around it still count. Nothing raises.

prometheus_client's ``text_string_to_metric_families`` is not used: its generator raises
``ValueError`` at the first malformed line and ends, so the good samples after it are lost
(a scrape's one broken line would cost the whole round), and it keeps values only as floats,
while 64-bit counters written as integers (dcgm-exporter's) should stay exact.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

MAX_PROBLEMS = 20  # per exposition; the rest are counted in one more line
_EXCERPT = 60
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Go's strconv.ParseFloat, decimal forms (what Prometheus' clients write).
_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?"
    r"|[nN][aA][nN])"
)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_OM_TIMESTAMP = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
OPENMETRICS_TYPES = frozenset({"unknown", "info", "stateset", "gaugehistogram"})
_BLANK = " \t"


class _Malformed(Exception):
    """One line does not parse; the message says why (one line)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: its metric name, labels, value (as written and as a float), timestamp in
    seconds when one was given, and the line it came from."""

    name: str
    labels: Mapping[str, str]
    value: float
    text: str
    timestamp_s: float | None = None
    line: int = 0

    def as_int(self) -> int | None:
        """The value as an exact integer: from its text when written as one (64-bit counters
        stay exact), else from the float when finite and whole; None otherwise."""
        if _INTEGER.fullmatch(self.text):
            return int(self.text)
        if math.isfinite(self.value) and self.value == math.floor(self.value):
            return int(self.value)
        return None


@dataclass(slots=True)
class Exposition:
    """What one exposition held: its samples in order, the declared types and help texts,
    and one line per problem (capped at ``MAX_PROBLEMS`` plus a count)."""

    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    malformed: int = 0

    def named(self, name: str) -> list[Sample]:
        """The samples of metric ``name``, in order."""
        return [sample for sample in self.samples if sample.name == name]


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "...")


def _rest(text: str) -> str:
    return _excerpt(text) if text else "end of line"


class _Cursor:
    """A position in one line."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def blanks(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in _BLANK:
            self.at += 1

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def done(self) -> bool:
        return self.at >= len(self.text)

    def match(self, pattern: re.Pattern[str], what: str) -> str:
        found = pattern.match(self.text, self.at)
        if found is None or found.end() == self.at:
            got = _rest(self.text[self.at :])
            message = f"expected {what} at column {self.at + 1}, got {got}"
            raise _Malformed(message)
        self.at = found.end()
        return found.group(0)

    def token(self) -> str:
        """Characters up to the next blank."""
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in _BLANK:
            self.at += 1
        return self.text[start : self.at]


def _label_value(cursor: _Cursor) -> str:
    if cursor.peek() != '"':
        message = f"expected '\"' at column {cursor.at + 1}"
        raise _Malformed(message)
    cursor.at += 1
    out: list[str] = []
    text = cursor.text
    while True:
        if cursor.done():
            message = "unterminated label value"
            raise _Malformed(message)
        char = text[cursor.at]
        if char == '"':
            cursor.at += 1
            return "".join(out)
        if char == "\\":
            escaped = text[cursor.at + 1 : cursor.at + 2]
            if escaped == "\\":
                out.append("\\")
            elif escaped == '"':
                out.append('"')
            elif escaped == "n":
                out.append("\n")
            else:
                message = f"unknown escape \\{escaped} in a label value at column {cursor.at + 1}"
                raise _Malformed(message)
            cursor.at += 2
            continue
        out.append(char)
        cursor.at += 1


def _labels(cursor: _Cursor) -> dict[str, str]:
    """The label set after the '{' (the cursor stands on it)."""
    cursor.at += 1
    labels: dict[str, str] = {}
    while True:
        cursor.blanks()
        if cursor.peek() == "}":
            cursor.at += 1
            return labels
        name = cursor.match(LABEL_NAME, "a label name or '}'")
        cursor.blanks()
        if cursor.peek() != "=":
            message = f"expected '=' after label {name}"
            raise _Malformed(message)
        cursor.at += 1
        cursor.blanks()
        value = _label_value(cursor)
        if name in labels:
            message = f"duplicate label {name}"
            raise _Malformed(message)
        labels[name] = value
        cursor.blanks()
        if cursor.peek() == ",":
            cursor.at += 1
        elif cursor.peek() != "}":
            message = f"expected ',' or '}}' after label {name}"
            raise _Malformed(message)


def _sample(text: str, number: int, openmetrics: bool) -> Sample:
    cursor = _Cursor(text)
    cursor.blanks()
    name = cursor.match(METRIC_NAME, "a metric name")
    labels: dict[str, str] = {}
    after_name = cursor.at
    cursor.blanks()
    if cursor.peek() == "{":
        labels = _labels(cursor)
    else:
        cursor.at = after_name
    if not cursor.peek() or cursor.peek() not in _BLANK:
        message = (
            f"expected a blank and a value after {name}, got {_rest(cursor.text[cursor.at :])}"
        )
        raise _Malformed(message)
    cursor.blanks()
    value_text = cursor.token()
    if not _FLOAT.fullmatch(value_text):
        message = f"not a value: {_excerpt(value_text)}"
        raise _Malformed(message)
    value = float(value_text)
    cursor.blanks()
    timestamp: float | None = None
    if not cursor.done() and not (openmetrics and cursor.peek() == "#"):
        stamp = cursor.token()
        if openmetrics and _OM_TIMESTAMP.fullmatch(stamp):
            timestamp = float(stamp)
        elif not openmetrics and _INTEGER.fullmatch(stamp):
            timestamp = int(stamp) / 1000
        else:
            message = f"not a timestamp: {_excerpt(stamp)}"
            raise _Malformed(message)
        cursor.blanks()
    if not cursor.done() and not (openmetrics and cursor.peek() == "#"):
        message = f"unexpected text after the sample: {_excerpt(cursor.text[cursor.at :])}"
        raise _Malformed(message)
    return Sample(name, labels, value, value_text, timestamp, number)


def _unescape_help(text: str) -> str:
    return re.sub(r"\\(\\|n)", lambda m: "\n" if m.group(1) == "n" else "\\", text)


def _comment(text: str, result: Exposition, openmetrics: bool) -> bool:
    """Take a '#' line; True when it was ``# EOF``."""
    body = text.lstrip(_BLANK)[1:]
    parts = body.strip(_BLANK).split(None, 2)
    if not parts or parts[0] not in {"HELP", "TYPE", "UNIT", "EOF"}:
        return False  # a plain comment
    keyword = parts[0]
    if keyword == "EOF":
        if len(parts) > 1:
            message = "text after # EOF"
            raise _Malformed(message)
        return True
    if len(parts) < 2 or not METRIC_NAME.fullmatch(parts[1]):
        message = f"# {keyword} without a metric name"
        raise _Malformed(message)
    name = parts[1]
    rest = parts[2] if len(parts) > 2 else ""
    if keyword == "HELP":
        if name in result.helps:
            message = f"second # HELP for {name}"
            raise _Malformed(message)
        result.helps[name] = _unescape_help(rest)
    elif keyword == "TYPE":
        kind = rest.strip(_BLANK)
        known = TYPES | (OPENMETRICS_TYPES if openmetrics else frozenset())
        if kind not in known:
            message = f"unknown type {_excerpt(kind)} for {name}"
            raise _Malformed(message)
        if name in result.types:
            message = f"second # TYPE for {name}"
            raise _Malformed(message)
        result.types[name] = kind
    return False


def _lines(text: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line.removesuffix("\r")


def parse(text: str, *, openmetrics: bool = False) -> Exposition:
    """Every well-formed sample of ``text``; each malformed line a problem (never raises)."""
    result = Exposition()
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    ended_at: int | None = None

    def problem(number: int, reason: str) -> None:
        result.malformed += 1
        if len(result.problems) < MAX_PROBLEMS:
            result.problems.append(f"line {number}: {reason}")

    for number, line in _lines(text):
        if not line.strip(_BLANK):
            continue
        if ended_at is not None:
            problem(number, f"text after # EOF (line {ended_at})")
            continue
        try:
            if line.lstrip(_BLANK).startswith("#"):
                if _comment(line, result, openmetrics):
                    ended_at = number
                continue
            sample = _sample(line, number, openmetrics)
        except _Malformed as error:
            problem(number, str(error))
            continue
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in seen:
            problem(number, f"duplicate series {sample.name}{_format_labels(sample.labels)}")
            continue
        seen.add(key)
        result.samples.append(sample)
    if result.malformed > len(result.problems):
        result.problems.append(
            f"{result.malformed - len(result.problems)} more malformed lines not listed"
        )
    return result


def _format_labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f"{name}={_excerpt(value)}" for name, value in labels.items())
    return "{" + (inner if len(inner) <= 2 * _EXCERPT else inner[: 2 * _EXCERPT] + "...") + "}"

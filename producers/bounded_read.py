"""Untrusted JSON text read in bounded pieces: nesting, record size and binary content are
checked before anything is parsed.

Python's json parser recurses once per nesting level (RecursionError at about 1,000 levels)
and orjson accepts up to 1,024: `value_end` counts the levels with a loop first, so no
parser ever sees a document nested deeper than `MAX_NESTING`. `JsonObjectFile` reads a file
of concatenated JSON objects (one a line, or pretty-printed) in chunks from where its last
read stopped, holding at most one record's text, and says what it skipped, one line each.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from pathlib import Path
from typing import Any

# Records nest a few levels (NCCL Inspector: 5); anything deeper is not one of them.
MAX_NESTING = 32
MAX_RECORD_CHARS = 1 << 20
READ_CHUNK_BYTES = 64 << 10
# A file of garbage would otherwise give a line per line of it.
MAX_PROBLEM_LINES = 20

# From a position inside a JSON value: the next bracket outside a string (group 1), else an
# unterminated string's quote or the end. Possessive, so each character is looked at once.
_NEXT_BRACKET = re.compile(r'(?:[^"{}\[\]]++|"(?:[^"\\]++|\\.)*+")*+(?:([{}\[\]])|"|\Z)', re.DOTALL)
_SPACE = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder()
# The first characters of a JSON value, NaN and Infinity included: a line starting with
# anything else is rejected without the parser (a file of such lines is read at speed).
_VALUE_STARTS = frozenset('{["-0123456789tfnNI')


def value_end(
    text: str, pos: int, endpos: int | None = None, depth: int = 0, limit: int = MAX_NESTING
) -> tuple[int, int]:
    """Where the JSON value at ``pos`` ends, found without parsing it (nothing recursive
    sees the text), and how many of its levels are still open there.

    0 open: the value ends there (a scalar ends with its line). More than ``limit``: it
    passed the limit there. Else it is still open at ``endpos``. Strings are skipped as the
    parser reads them, so up to where the parser would fail, the depth is the parser's.
    ``depth``: levels already open at ``pos`` (a scan going on from where one stopped).
    """
    end = len(text) if endpos is None else endpos
    if depth == 0 and (pos >= end or text[pos] not in "{["):
        newline = text.find("\n", pos, end)
        return (end if newline < 0 else newline), 0
    while True:
        match = _NEXT_BRACKET.match(text, pos, end)
        bracket = match.group(1) if match else None
        if match is None or bracket is None:
            return end, depth  # the end, or a string the parser stops at
        pos = match.end()
        depth += 1 if bracket in "{[" else -1
        if depth == 0 or depth > limit:
            return pos, depth


def short_reason(error: Exception | str, limit: int = 120) -> str:
    """An error's text on one line, cut to ``limit`` characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse(value: str) -> tuple[Any, int, int, str]:
    """The first JSON value of ``value`` and its length, else where and why parsing failed
    (as ``(None, 0, position, reason)``); ``value`` is never nested too deep."""
    try:
        obj, length = _DECODER.raw_decode(value)
    except json.JSONDecodeError as error:
        return None, 0, error.pos, error.msg
    except ValueError as error:  # a number past int's digit limit
        return None, 0, 0, short_reason(error)
    return obj, length, -1, ""


def _lines_of_value(text: str, pos: int, line_end: int, depth: int) -> tuple[int, int, str]:
    """The extent of a value at ``pos`` that is valid to the end of its line, with ``depth``
    levels open there: where it ends, passes the nesting limit or (still open) the text
    ends; its depth there; and why it is broken if it breaks off before.

    The lines looked at double each round, scanned on for depth and parsed, so a value that
    breaks off on its second line costs two lines, not the nesting limit's worth.
    """
    size = len(text)
    scanned, lines = line_end, 1
    while True:
        window_end = scanned
        for _ in range(lines):
            newline = text.find("\n", window_end + 1)
            window_end = size if newline < 0 else newline
            if newline < 0:
                break
        stop, depth = value_end(text, scanned, window_end, depth)
        if depth == 0 or (depth <= MAX_NESTING and window_end >= size):
            return stop, depth, ""  # ends, or is open at the end of the text
        # Parsed as far as it is known not to nest too deep: is it valid that far?
        prefix = text[pos : stop - 1] if depth > MAX_NESTING else text[pos:window_end]
        _, _, failed_at, why = _parse(prefix)
        if failed_at < len(prefix):
            return stop, depth, f"invalid JSON ({why})"
        if depth > MAX_NESTING:
            return stop, depth, ""
        scanned, lines = window_end, lines * 2


def split_json(
    text: str, final: bool = False, max_chars: int = MAX_RECORD_CHARS
) -> tuple[list[Any], int, list[tuple[int, str]]]:
    """The complete JSON values at the start of ``text``, the characters they used, and the
    position and reason of each thing skipped.

    A syntax error skips to the next line, as does a value over ``max_chars``; a value
    nested deeper than `MAX_NESTING` is skipped to the end of the line where it passed that.
    Unless ``final``, a value that may be cut off at the end is left unread, to be read with
    what follows. Each value is parsed on its own, so that a syntax error's line number is
    counted in the value only.
    """
    objects: list[Any] = []
    errors: list[tuple[int, str]] = []
    size = len(text)
    pos = 0
    while True:
        space = _SPACE.match(text, pos)
        pos = space.end() if space else pos
        if pos >= size:
            return objects, pos, errors
        newline = text.find("\n", pos)
        line_end = size if newline < 0 else newline
        next_line = size if newline < 0 else newline + 1
        line_done = newline >= 0 or final
        if text[pos] not in _VALUE_STARTS:
            if not line_done:
                return objects, pos, errors  # its line is not complete yet
            errors.append((pos, "invalid JSON (Expecting value)"))  # as the parser says
            pos = next_line
            continue
        # Its own line first: a value that ends there, or breaks off there, costs that line
        # only, however much text follows.
        stop, depth = value_end(text, pos, line_end)
        broken = ""
        if depth > MAX_NESTING:
            broken = f"nested deeper than {MAX_NESTING} levels"
        elif depth > 0:
            _, _, failed_at, why = _parse(text[pos:line_end])
            if failed_at < line_end - pos:  # not merely open at the end of the line
                broken = f"invalid JSON ({why})"
        if broken:
            if not line_done:
                return objects, pos, errors  # its line is not complete yet
            errors.append((pos, broken))
            pos = next_line
            continue
        if depth > 0:  # valid to the end of its line: a value over several lines
            stop, depth, broken = _lines_of_value(text, pos, line_end, depth)
            if broken:
                errors.append((pos, broken))
                pos = next_line
                continue
            if depth > MAX_NESTING:
                # Valid up to where it passed the limit: all of that is inside it, skipped.
                deep_newline = text.find("\n", stop)
                if deep_newline < 0 and not final:
                    return objects, pos, errors  # that line is not complete yet
                errors.append((pos, f"nested deeper than {MAX_NESTING} levels"))
                pos = size if deep_newline < 0 else deep_newline + 1
                continue
        if depth == 0 and text[pos] not in "{[" and not line_done:
            return objects, pos, errors  # a number at the end may go on
        value = text[pos:stop]
        obj, length, failed_at, why = _parse(value)
        if failed_at >= 0:
            if depth > 0 and "\n" not in value[failed_at:] and not final:
                return objects, pos, errors  # open, failing on the last line: probably cut off
            errors.append((pos, f"invalid JSON ({why})"))
            pos = next_line
            continue
        if length > max_chars:
            errors.append((pos, f"a record of {length} characters (at most {max_chars})"))
        else:
            objects.append(obj)
        pos += length


def numbered(text: str, errors: list[tuple[int, str]], first_line: int = 1) -> list[str]:
    """Each error of `split_json` as ``line N: reason``, ``text`` starting at ``first_line``."""
    lines: list[str] = []
    counted, line = 0, first_line
    for pos, reason in errors:  # in order: the newlines are counted once
        line += text.count("\n", counted, pos)
        counted = pos
        lines.append(f"line {line}: {reason}")
    return lines


class ProblemLines:
    """One line per problem, at most `MAX_PROBLEM_LINES`; the others counted in a last one."""

    def __init__(self, limit: int = MAX_PROBLEM_LINES) -> None:
        self.limit = limit
        self.lines: list[str] = []
        self.hidden = 0

    def add(self, line: str) -> None:
        """Keep ``line`` if there is room, else count it."""
        if len(self.lines) < self.limit:
            self.lines.append(line)
        else:
            self.hidden += 1

    def done(self, where: str) -> list[str]:
        """The lines kept, and one saying how many more there were (about ``where``)."""
        if not self.hidden:
            return self.lines
        return [*self.lines, f"{where}: {self.hidden} more problems not shown"]


class JsonObjectFile:
    """A file of concatenated JSON objects, read in bounded chunks from where the last read
    stopped; a file truncated or replaced by a shorter one is read again from its start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._restart()

    def _restart(self) -> None:
        self._offset = 0  # bytes of the file read so far
        self._line = 1  # the line number of the pending text's first character
        self._pending = ""  # the start of a record whose end is still to come
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._skipping = False  # dropping an over-long record up to the end of its line
        self._binary = False

    def read(
        self, final: bool = False, max_bytes: int | None = None
    ) -> tuple[list[Any], list[str]]:
        """The objects completed since the last read, and one line per problem.

        ``final``: the file is complete, so a record cut off at its end is a problem rather
        than one to wait for. ``max_bytes``: read at most this much now, the rest later.
        """
        objects: list[Any] = []
        problems = ProblemLines()
        try:
            with self.path.open("rb") as stream:
                if os.fstat(stream.fileno()).st_size < self._offset:
                    self._restart()
                if self._binary:
                    return objects, []
                stream.seek(self._offset)
                left = max_bytes
                while left is None or left > 0:
                    chunk = stream.read(min(left or READ_CHUNK_BYTES, READ_CHUNK_BYTES))
                    if not chunk:
                        break
                    if left is not None:
                        left -= len(chunk)
                    nul = chunk.find(b"\0")
                    if nul >= 0:
                        self._take(chunk[:nul], False, objects, problems)
                        problems.add(
                            f"{self.path}: binary data (a NUL byte at byte {self._offset + nul}),"
                            " not JSON: the rest of the file is skipped"
                        )
                        self._offset += len(chunk)
                        self._binary, self._pending = True, ""
                        return objects, problems.done(str(self.path))
                    self._offset += len(chunk)
                    self._take(chunk, False, objects, problems)
        except OSError as error:
            problems.add(f"{self.path}: cannot read ({error.strerror or error})")
            return objects, problems.done(str(self.path))
        if final:
            self._take(b"", True, objects, problems)
        return objects, problems.done(str(self.path))

    def _take(self, data: bytes, final: bool, objects: list[Any], problems: ProblemLines) -> None:
        """Read the objects out of what is pending and ``data``; keep an incomplete rest."""
        text = self._pending + self._decoder.decode(data, final=final)
        self._pending = ""
        while True:
            if self._skipping:
                newline = text.find("\n")
                if newline < 0:
                    return
                text, self._skipping = text[newline + 1 :], False
                self._line += 1
            found, used, errors = split_json(text, final)
            objects.extend(found)
            for line in numbered(text, errors, self._line):
                problems.add(f"{self.path}: {line}")
            self._line += text.count("\n", 0, used)
            text = text[used:]
            if len(text) <= MAX_RECORD_CHARS:
                self._pending = text
                return
            problems.add(
                f"{self.path}: line {self._line}: a record over {MAX_RECORD_CHARS} characters,"
                " skipped to the end of its line"
            )
            self._skipping = True

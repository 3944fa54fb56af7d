"""Slurm host lists (``node-[000-003,007],gpu[1-2]-ib``) expanded to names, without Slurm.

`expand_hostlist` reads what Slurm writes in ``SLURM_JOB_NODELIST``: names separated by
commas, each with any number of bracketed ranges (``a-b`` or single numbers, separated by
commas); a range keeps the zero padding of its lower bound (``[08-10]``: 08, 09, 10).
Several bracket groups in one name give every combination, the last group varying
fastest, as ``scontrol show hostnames`` lists them. Pure: no ``scontrol`` needed.
"""

from __future__ import annotations

import itertools
import re

MAX_HOSTS = 65_536  # as many as a member message's job_nodes may hold
_RANGE = re.compile(r"(?P<low>[0-9]+)(?:-(?P<high>[0-9]+))?")


class HostlistError(ValueError):
    """A host list that is not in Slurm's syntax, or that names too many hosts."""


def expand_hostlist(text: str, limit: int = MAX_HOSTS) -> list[str]:
    """The names of ``text`` in order, each once (a HostlistError past ``limit`` names)."""
    names: list[str] = []
    seen: set[str] = set()
    for item in _split_top_level(text.strip()):
        for name in _expand_item(item, limit):
            if name not in seen:
                if len(names) >= limit:
                    message = f"{text[:80]!r} names more than {limit} hosts"
                    raise HostlistError(message)
                seen.add(name)
                names.append(name)
    return names


def _split_top_level(text: str) -> list[str]:
    """``text`` cut at the commas outside brackets (empty items left out)."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                message = f"nested brackets in {text[:80]!r}"
                raise HostlistError(message)
        elif char == "]":
            depth -= 1
            if depth < 0:
                message = f"']' without '[' in {text[:80]!r}"
                raise HostlistError(message)
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
        elif char.isspace():
            message = f"whitespace in host list {text[:80]!r}"
            raise HostlistError(message)
    if depth:
        message = f"'[' without ']' in {text[:80]!r}"
        raise HostlistError(message)
    items.append(text[start:])
    return [item for item in items if item]


def _expand_item(item: str, limit: int) -> list[str]:
    """One name with its bracket groups expanded: literal parts and ranges, combined."""
    parts: list[list[str]] = []
    rest = item
    while "[" in rest:
        before, _, after = rest.partition("[")
        inside, _, rest = after.partition("]")
        parts.append([before])
        parts.append(_expand_ranges(inside, item, limit))
    parts.append([rest])
    count = 1
    for part in parts:
        count *= len(part)
        if count > limit:
            message = f"{item[:80]!r} names more than {limit} hosts"
            raise HostlistError(message)
    return ["".join(combination) for combination in itertools.product(*parts)]


def _expand_ranges(inside: str, item: str, limit: int) -> list[str]:
    """``000-003,007`` -> 000, 001, 002, 003, 007."""
    numbers: list[str] = []
    for piece in inside.split(","):
        match = _RANGE.fullmatch(piece)
        if match is None:
            message = f"bad range {piece!r} in {item[:80]!r}"
            raise HostlistError(message)
        low, high = match.group("low"), match.group("high")
        if high is None:
            numbers.append(low)
            continue
        first, last = int(low), int(high)
        if last < first:
            message = f"range {piece!r} runs backwards in {item[:80]!r}"
            raise HostlistError(message)
        if last - first + len(numbers) >= limit:
            message = f"{item[:80]!r} names more than {limit} hosts"
            raise HostlistError(message)
        numbers.extend(str(number).zfill(len(low)) for number in range(first, last + 1))
    return numbers

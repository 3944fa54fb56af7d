"""``--map``: renames for sites whose fabric names differ from the scheduler's.

One rename a line, ``FROM TO``, shell-quoted where a name has spaces; ``#`` starts a comment.
``FROM`` is a node GUID (``0x...``, ibnetdiscover only), a NodeDescription or switch name as
the input gives it, or a host name::

    0x0002c90300a1b2c3  "node-003 mlx5_2"
    "MF0;ib-sw01:MQM9700/U1"  leaf-01
    gpu003  node-003
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from topology.fabric import at_line


@dataclass(frozen=True, slots=True)
class NameMap:
    """Renames by GUID and by name."""

    by_guid: dict[int, str]
    by_name: dict[str, str]

    def name(self, name: str, guid: int | None = None) -> str:
        """The new name of a node (by GUID first), or its own."""
        if guid is not None and guid in self.by_guid:
            return self.by_guid[guid]
        return self.by_name.get(name, name)


NO_RENAMES = NameMap({}, {})


def parse_name_map(text: str, source: str) -> NameMap:
    """The renames of a map file; `ImportInputError` naming the line of a bad one."""
    by_guid: dict[int, str] = {}
    by_name: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as error:
            raise at_line(source, number, f"{error}") from None
        if not words:
            continue
        if len(words) != 2:
            raise at_line(source, number, f"expected FROM TO, got {len(words)} words")
        old, new = words
        if old.lower().startswith("0x"):
            try:
                by_guid[int(old, 16)] = new
            except ValueError:
                raise at_line(source, number, f"bad GUID {old!r}") from None
        else:
            by_name[old] = new
    return NameMap(by_guid, by_name)

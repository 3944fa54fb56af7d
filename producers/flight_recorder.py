"""The node agent's Flight Recorder source: a dump folder watched, new dumps as messages.

The dumps are read by `producers.fr_dump` (plain data only), their entries taken apart by
`producers.fr_entries`, aligned across ranks by `producers.fr_align` and turned into v1
collective messages by `producers.fr_convert`. The public names of those modules are
importable from here too.
"""

from __future__ import annotations

from pathlib import Path

from producers.fr_convert import NS_PER_S, Conversion, convert
from producers.fr_dump import (
    MAX_DUMP_BYTES,
    FlightRecorderError,
    RankDump,
    is_dump_name,
    load_dump,
    rank_of,
    read_dump_file,
    read_dump_folder,
)
from producers.fr_entries import DTYPE_BYTES, op_name
from producers.sources import Reading

__all__ = [
    "DTYPE_BYTES",
    "MAX_DUMP_BYTES",
    "NS_PER_S",
    "Conversion",
    "FlightRecorderError",
    "FlightRecorderSource",
    "RankDump",
    "convert",
    "load_dump",
    "op_name",
    "rank_of",
    "read_dump_file",
    "read_dump_folder",
]


class FlightRecorderSource:
    """Watches a dump folder; each new or rewritten dump becomes that rank's messages.

    The folder's other dumps are read again with it: a pair's point-to-point ``seq`` is
    aligned across its two sides.
    """

    def __init__(self, folder: Path, job: str, interval_s: float = 5.0) -> None:
        self.name = "flight-recorder"
        self.interval_s = interval_s
        self.folder, self.job = folder, job
        self._seen: dict[Path, int] = {}

    def read(self, now_ns: int) -> Reading:
        """Convert the dumps written since the last round (each read is bounded, see
        `producers.fr_dump`; a bad file is reported once and the others still converted)."""
        del now_ns  # the messages carry the dump's own times
        reading = Reading()
        paths = sorted(self.folder.iterdir()) if self.folder.is_dir() else []
        new_paths: set[Path] = set()
        present: list[Path] = []
        for path in paths:
            if not path.is_file() or not is_dump_name(path.name):
                continue
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                continue
            present.append(path)
            if self._seen.get(path) != mtime:
                new_paths.add(path)
            self._seen[path] = mtime
        if not new_paths:
            return reading  # nothing new: the dumps are not read again
        dumps: list[RankDump] = []
        changed: set[int] = set()
        for path in present:
            try:
                dump = read_dump_file(path)
            except FlightRecorderError as error:
                if path in new_paths:
                    reading.problems.append(str(error))
                continue
            dumps.append(dump)
            if path in new_paths:
                changed.add(dump.rank)
        if not changed:
            return reading
        conversion = convert(dumps, self.job)
        reading.messages.extend(m for m in conversion.messages if m.global_rank in changed)
        reading.problems.extend(conversion.skipped)
        return reading

    def close(self) -> None:
        """Nothing is held open between rounds."""

"""A bounded first-in first-out queue of Kafka records on local disk.

The publisher writes here while the broker is unreachable and replays from here, oldest
first, when it answers again. The queue lives in segment files (``<number>.seg``) so that
it survives a restart of the agent; a frame torn by a crash is cut off when the folder is
opened again. When it is full, room is made by dropping the oldest heartbeats first
(collective messages with empty ops: the next heartbeat says the same thing), and only when
no heartbeat is left the oldest records; both drops are counted.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from producers import ProducerError

# value length, flags, topic length, key length
_HEADER = struct.Struct(">IBHH")
_HEARTBEAT = 1
_OFFSET_FILE = "head.offset"
FIRST_SEGMENT = 10**9


class SpoolError(ProducerError):
    """The spool folder cannot be used."""


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record as the publisher produces it."""

    topic: str
    key: bytes
    value: bytes
    heartbeat: bool = False

    @property
    def size(self) -> int:
        """Bytes it takes in a segment file."""
        return _HEADER.size + len(self.topic.encode()) + len(self.key) + len(self.value)


@dataclass(slots=True)
class SpoolCounts:
    """What went through the spool."""

    spooled: int = 0
    taken: int = 0
    dropped_heartbeats: int = 0
    dropped_records: int = 0


def _frame(record: Record) -> bytes:
    topic = record.topic.encode()
    flags = _HEARTBEAT if record.heartbeat else 0
    header = _HEADER.pack(len(record.value), flags, len(topic), len(record.key))
    return header + topic + record.key + record.value


def _read_frames(data: bytes) -> tuple[list[Record], int]:
    """The whole frames of a segment and the length they cover (a torn tail is left out)."""
    records: list[Record] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        value_len, flags, topic_len, key_len = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + topic_len + key_len + value_len
        if end > len(data):
            break
        start = pos + _HEADER.size
        topic = data[start : start + topic_len].decode(errors="replace")
        key = data[start + topic_len : start + topic_len + key_len]
        value = data[start + topic_len + key_len : end]
        records.append(Record(topic, key, value, bool(flags & _HEARTBEAT)))
        pos = end
    return records, pos


class DiskSpool:
    """Records in arrival order, at most ``max_bytes`` of segment files in ``folder``."""

    def __init__(
        self, folder: Path, max_bytes: int = 256 << 20, segment_bytes: int = 4 << 20
    ) -> None:
        if max_bytes < 1 or segment_bytes < 1:
            message = "spool sizes must be positive"
            raise SpoolError(message)
        self.folder = folder
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes, max_bytes)
        self.counts = SpoolCounts()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._segments: deque[Path] = deque(sorted(folder.glob("*.seg")))
        except OSError as error:
            message = f"spool folder {folder}: {error.strerror or error}"
            raise SpoolError(message) from error
        self._head: deque[Record] | None = None  # the head segment's records not yet taken
        self._head_total = 0  # records the head segment held when it was loaded
        self._tail: BinaryIO | None = None
        self._bytes = 0
        self._count = 0
        self._recover()

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        """Bytes of records waiting (segment files, less what was taken from the head)."""
        return self._bytes

    def _recover(self) -> None:
        offset = 0
        offset_path = self.folder / _OFFSET_FILE
        if offset_path.exists():
            try:
                offset = int(offset_path.read_text(encoding="ascii").strip() or 0)
            except (OSError, ValueError):
                offset = 0
        for index, path in enumerate(self._segments):
            data = path.read_bytes()
            records, good = _read_frames(data)
            if good < len(data):
                with path.open("r+b") as segment:
                    segment.truncate(good)
            skip = min(offset, len(records)) if index == 0 else 0
            self._count += len(records) - skip
            self._bytes += sum(record.size for record in records[skip:])

    def _next_segment(self) -> Path:
        # Numbering starts high, so that records handed back can go in front (`prepend`).
        number = int(self._segments[-1].stem) + 1 if self._segments else FIRST_SEGMENT
        return self.folder / f"{number:012d}.seg"

    def prepend(self, records: list[Record]) -> None:
        """Put records back in front of the oldest, in the given order (what the publisher
        had handed to librdkafka and could not deliver before it closed); no bound applies."""
        if not records:
            return
        if self._segments:
            self._rewrite_head_untaken()
            number = int(self._segments[0].stem) - 1
        else:
            number = FIRST_SEGMENT
        path = self.folder / f"{number:012d}.seg"
        with path.open("wb") as out:
            out.write(b"".join(_frame(record) for record in records))
            out.flush()
            os.fsync(out.fileno())
        self._segments.appendleft(path)
        self._head, self._head_total = None, 0
        self._save_offset()
        self._count += len(records)
        self._bytes += sum(record.size for record in records)

    def _rewrite_head_untaken(self) -> None:
        """Rewrite the head segment without the records already taken from it."""
        path = self._segments[0]
        if self._tail is not None and len(self._segments) == 1:
            self._close_tail()
        records = list(self._load_head())
        if len(records) != self._head_total:
            temporary = path.with_suffix(".tmp")
            temporary.write_bytes(b"".join(_frame(record) for record in records))
            temporary.replace(path)

    def append(self, record: Record) -> None:
        """Add a record at the end, first dropping what must go to stay under the bound."""
        size = record.size
        if size > self.max_bytes:
            self.counts.dropped_records += 1
            return
        self._make_room(size)
        if self._tail is None or self._tail.tell() >= self.segment_bytes:
            self._close_tail()
            path = self._next_segment()
            self._segments.append(path)
            self._tail = path.open("ab")
        self._tail.write(_frame(record))
        self._tail.flush()
        self._bytes += size
        self._count += 1
        self.counts.spooled += 1

    def take(self, limit: int) -> list[Record]:
        """Remove and return up to ``limit`` of the oldest records."""
        taken = self._pop(limit)
        self.counts.taken += len(taken)
        return taken

    def _pop(self, limit: int) -> list[Record]:
        taken: list[Record] = []
        while len(taken) < limit and self._count:
            head = self._load_head()
            while head and len(taken) < limit:
                record = head.popleft()
                taken.append(record)
                self._bytes -= record.size
                self._count -= 1
            if not head:
                self._drop_head_segment()
        if taken:
            self._save_offset()
        return taken

    def _load_head(self) -> deque[Record]:
        if self._head is None:
            path = self._segments[0]
            if self._tail is not None and len(self._segments) == 1:
                self._close_tail()
            records, _ = _read_frames(path.read_bytes())
            offset = self._stored_offset()
            self._head = deque(records[offset:])
            self._head_total = len(records)
        return self._head

    def _stored_offset(self) -> int:
        path = self.folder / _OFFSET_FILE
        try:
            return int(path.read_text(encoding="ascii").strip() or 0)
        except (OSError, ValueError):
            return 0

    def _save_offset(self) -> None:
        taken = 0 if self._head is None else self._head_total - len(self._head)
        (self.folder / _OFFSET_FILE).write_text(str(taken), encoding="ascii")

    def _drop_head_segment(self) -> None:
        path = self._segments.popleft()
        if self._tail is not None and not self._segments:
            self._close_tail()
        path.unlink(missing_ok=True)
        self._head = None
        self._head_total = 0
        self._save_offset()

    def _close_tail(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    def _make_room(self, size: int) -> None:
        if self._bytes + size <= self.max_bytes:
            return
        # Heartbeats first, oldest segment first: compacting rewrites a segment without them.
        for index in range(len(self._segments)):
            if self._bytes + size <= self.max_bytes:
                return
            self._compact(index)
        while self._count and self._bytes + size > self.max_bytes:
            self.counts.dropped_records += len(self._pop(1))

    def _compact(self, index: int) -> None:
        path = self._segments[index]
        if index == len(self._segments) - 1:
            self._close_tail()
        if index == 0:
            records = list(self._load_head())
        else:
            records, _ = _read_frames(path.read_bytes())
        kept = [record for record in records if not record.heartbeat]
        dropped = len(records) - len(kept)
        if not dropped:
            return
        temporary = path.with_suffix(".tmp")
        with temporary.open("wb") as out:
            out.write(b"".join(_frame(record) for record in kept))
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(path)
        self.counts.dropped_heartbeats += dropped
        self._count -= dropped
        self._bytes -= sum(record.size for record in records if record.heartbeat)
        if index == 0:
            self._head = deque(kept)
            self._head_total = len(kept)
            self._save_offset()

    def close(self) -> None:
        """Close the open segment (records stay on disk for the next start)."""
        self._close_tail()

"""Handing v1 messages from a training process to the node agent through a local folder.

The training process appends JSON lines to a file of its own (`FolderSink`); the node agent
tails every file of the folder (`HandoffSource`) and publishes what it reads, so the
training process needs no Kafka client. A line cut off at the end of a file waits for the
next round; a line that is not a valid v1 message is a problem line and is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from producers.sources import Reading
from schemas.base import C4Model
from schemas.codec import Rejection, decode, encode

MAX_READ_BYTES = 64 << 20  # per file and round: a long backlog is read over several rounds


class FolderSink:
    """Appends messages as JSON lines to ``folder/<name>.jsonl`` (one writer per file)."""

    def __init__(self, folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{name}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, messages: Iterable[C4Model]) -> None:
        """Write one batch with one system call, so a reader never sees half a batch's line."""
        data = b"".join(encode(message) + b"\n" for message in messages)
        if data:
            os.write(self._fd, data)

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


class HandoffSource:
    """The messages appended to the folder's ``*.jsonl`` files since the last round."""

    def __init__(self, folder: Path, interval_s: float = 1.0, name: str = "handoff") -> None:
        self.name = name
        self.interval_s = interval_s
        self.folder = folder
        self._offsets: dict[Path, int] = {}

    def read(self, now_ns: int) -> Reading:
        """Decode every complete new line of every file."""
        del now_ns  # the messages carry their own times
        reading = Reading()
        paths = sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []
        for path in paths:
            offset = self._offsets.get(path, 0)
            try:
                if path.stat().st_size < offset:
                    offset = 0  # the file was replaced
                with path.open("rb") as stream:
                    stream.seek(offset)
                    data = stream.read(MAX_READ_BYTES)
            except OSError as error:
                reading.problems.append(f"{path}: cannot read ({error.strerror or error})")
                continue
            complete = data.rfind(b"\n") + 1
            start = 0
            while start < complete:
                stop = data.index(b"\n", start)
                line = data[start:stop]
                if line.strip():
                    result = decode(line)
                    if isinstance(result, Rejection):
                        where = f"{path} byte {offset + start}"
                        reading.problems.append(f"{where}: {result.reason}")
                    else:
                        reading.messages.append(result)
                start = stop + 1
            self._offsets[path] = offset + complete
        return reading

    def close(self) -> None:
        """Nothing is held open between rounds."""

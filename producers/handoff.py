"""Handing v1 messages from a training process to the node agent through a local folder.

The training process appends JSON lines to files of its own (`FolderSink`:
``<name>.<n>.jsonl``, a new one every ``max_bytes``); the node agent tails every file of the
folder (`HandoffSource`), publishes what it reads, and deletes a writer's file once it has
read all of it and the writer has moved on to a newer one, so the folder stays small and the
training process needs no Kafka client. A line cut off at the end of a file waits for the
next round; a line that is not a valid v1 message is a problem line and is skipped.

With a checkpoint file, the read positions survive the agent: the agent commits them only
when every message read so far is acknowledged by the broker or in the disk spool, and a
file is deleted only once it is committed to its end. A restarted agent (kill -9 included)
goes on from the last commit: what it had read but not yet delivered is read again
(at-least-once; the detectors take a repeated operation report once), nothing is skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import orjson

from producers.sources import Reading
from schemas.base import C4Model
from schemas.codec import Rejection, decode, encode

MAX_READ_BYTES = 64 << 20  # per file and round: a long backlog is read over several rounds
_NUMBERED = re.compile(r"^(?P<writer>.+)\.(?P<index>\d{6})\.jsonl$")


class FolderSink:
    """Appends messages as JSON lines to ``folder/<name>.<n>.jsonl`` (one writer per name)."""

    def __init__(self, folder: Path, name: str, max_bytes: int = 64 << 20) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.name, self.max_bytes = folder, name, max_bytes
        taken = [
            int(match.group("index"))
            for path in folder.glob(f"{glob_escape(name)}.*.jsonl")
            if (match := _NUMBERED.match(path.name)) and match.group("writer") == name
        ]
        self._index = max(taken, default=0) + 1
        self._open()

    def _open(self) -> None:
        self.path = self.folder / f"{self.name}.{self._index:06d}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size

    def __call__(self, messages: Iterable[C4Model]) -> None:
        """Write one batch with one system call, so a reader never sees half a batch's line."""
        data = b"".join(encode(message) + b"\n" for message in messages)
        if not data:
            return
        if self._size and self._size + len(data) > self.max_bytes:
            os.close(self._fd)
            self._index += 1
            self._open()
        os.write(self._fd, data)
        self._size += len(data)

    @property
    def size(self) -> int:
        """Bytes in the current file (``self.path``)."""
        return self._size

    def close(self) -> None:
        """Close the current file."""
        os.close(self._fd)


def glob_escape(text: str) -> str:
    """``text`` with glob metacharacters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", text)


class HandoffSource:
    """The messages appended to the folder's ``*.jsonl`` files since the last round."""

    def __init__(
        self,
        folder: Path,
        interval_s: float = 1.0,
        name: str = "handoff",
        checkpoint: Path | None = None,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.folder = folder
        self.checkpoint = checkpoint
        self._offsets: dict[Path, int] = {}  # read up to here
        self._committed: dict[Path, int] = {}  # delivered (or spooled) up to here
        self._startup_problem: str | None = None
        self._failing_commit = False
        if checkpoint is not None:
            self._offsets = self._load(checkpoint)
            self._committed = dict(self._offsets)

    def _load(self, checkpoint: Path) -> dict[Path, int]:
        """The committed positions; an unreadable checkpoint means reading from the start."""
        try:
            data = orjson.loads(checkpoint.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as error:
            self._startup_problem = (
                f"{checkpoint}: unreadable checkpoint ({error}); reading every file from its start"
            )
            return {}
        if not isinstance(data, dict) or not all(
            isinstance(name, str) and "/" not in name and type(at) is int and at >= 0
            for name, at in data.items()
        ):
            self._startup_problem = (
                f"{checkpoint}: not a map of file name to byte offset; "
                "reading every file from its start"
            )
            return {}
        # A file deleted meanwhile is forgotten: a later file of that name starts afresh.
        return {
            self.folder / name: at for name, at in data.items() if (self.folder / name).exists()
        }

    def commit(self) -> str | None:
        """Record that everything read so far is delivered: written atomically, when changed.

        The problem as one line when the checkpoint cannot be written (tried again at the
        next commit; meanwhile a restart would read some messages a second time).
        """
        if self.checkpoint is None or self._committed == self._offsets:
            return None
        data = orjson.dumps({path.name: at for path, at in sorted(self._offsets.items())})
        temporary = self.checkpoint.with_name(self.checkpoint.name + ".tmp")
        try:
            temporary.write_bytes(data)
            os.replace(temporary, self.checkpoint)
        except OSError as error:
            if self._failing_commit:
                return None
            self._failing_commit = True
            return f"{self.checkpoint}: cannot write the checkpoint ({error.strerror or error})"
        self._failing_commit = False
        self._committed = dict(self._offsets)
        return None

    def read(self, now_ns: int) -> Reading:
        """Decode every complete new line of every file."""
        del now_ns  # the messages carry their own times
        reading = Reading()
        if self._startup_problem is not None:
            reading.problems.append(self._startup_problem)
            self._startup_problem = None
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
        self._forget_finished(paths)
        return reading

    def _forget_finished(self, paths: list[Path]) -> None:
        """Delete the files read (committed, with a checkpoint) to their end whose writer has a
        newer file."""
        done = self._offsets if self.checkpoint is None else self._committed
        newest: dict[str, int] = {}
        for path in paths:
            match = _NUMBERED.match(path.name)
            if match:
                writer, index = match.group("writer"), int(match.group("index"))
                newest[writer] = max(newest.get(writer, 0), index)
        for path in paths:
            match = _NUMBERED.match(path.name)
            if match is None or int(match.group("index")) >= newest[match.group("writer")]:
                continue
            try:
                if done.get(path, -1) >= path.stat().st_size:
                    path.unlink()
                    self._offsets.pop(path, None)
                    self._committed.pop(path, None)
            except OSError:
                continue

    def close(self) -> None:
        """Nothing is held open between rounds."""
